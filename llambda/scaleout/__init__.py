"""Scale-out: llambda replicas under Ray Serve, with prefix-aware routing (`llambda serve --ray`).

Only the modules named for Ray (deployments, routers, the launcher) import it, and only when used;
the policy, the forwarding format and the metrics merge are plain Python (tested without Ray).
"""
