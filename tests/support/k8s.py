"""The dev Kubernetes cluster's release as tests see it (kubectl, its environment).

The helpers live in the load-test package (chaos/cluster.py), shared with `make chaos-k8s`.
"""

from __future__ import annotations

from flashcoupon_loadtest.chaos.cluster import Release, burst_with, deploy_env, wait_for

__all__ = ["Release", "burst_with", "deploy_env", "wait_for"]
