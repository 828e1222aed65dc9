"""The local platform: replicas as child processes, each in its own CPU cgroup.

``config`` (the ``replicas:`` model), ``cgroups`` (v2/v1 detection, limits, usage),
``launch`` (the exec shim: cgroup join + parent-death signal), ``replicas`` (one
process), ``probe`` (HTTP readiness), ``pool`` (desired state per service, supervision).
"""
