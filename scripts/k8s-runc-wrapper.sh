#!/usr/bin/env bash
# DEV CLUSTER ONLY (docs/deploy.md, "the oom_score_adj workaround"). containerd's runc BinaryName
# in the config scripts/k8s.sh writes; never installed anywhere else.
#
# The kubelet asks for a negative oom_score_adj for pod sandboxes (-998) and Guaranteed
# containers (-997). Lowering oom_score_adj needs CAP_SYS_RESOURCE, which this sandbox withholds,
# so runc fails with "can't get final child's PID from pipe: EOF". Before `runc create` (and
# `runc exec --process`), a negative oomScoreAdj in the OCI spec is raised to 0 — the kernel's
# default — and nothing else in the spec is touched. Positive values (BestEffort 1000,
# Burstable 2..999) pass through unchanged, so eviction order among pods is kept.
set -euo pipefail
PATH=$PATH:/usr/sbin:/usr/bin:/sbin:/bin

raise_negative() { # spec.json, edited in place when it holds a negative oomScoreAdj
  local file=$1 jqpath=$2
  [ -f "$file" ] || return 0
  if jq -e "($jqpath // 0) < 0" "$file" >/dev/null 2>&1; then
    jq -c "$jqpath = 0" "$file" >"$file.oomfix" && mv "$file.oomfix" "$file"
  fi
}

args=("$@")
bundle="" process="" sub=""
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --bundle | -b) bundle=${args[i + 1]:-} ;;
    --bundle=*) bundle=${args[i]#--bundle=} ;;
    --process | -p) process=${args[i + 1]:-} ;;
    --process=*) process=${args[i]#--process=} ;;
    create | run | exec) [ -n "$sub" ] || sub=${args[i]} ;;
  esac
done
case "$sub" in
  create | run) raise_negative "${bundle:-.}/config.json" .process.oomScoreAdj ;;
  exec) [ -z "$process" ] || raise_negative "$process" .oomScoreAdj ;;
esac
exec runc "$@"
