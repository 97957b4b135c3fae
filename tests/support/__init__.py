"""Helpers every test tier shares: environments, ports, polling, processes."""
