"""The local platform: replicas as child processes, each in its own CPU cgroup.

``config`` (the ``replicas:`` model), ``cgroups`` (v2/v1 detection, limits, usage of one
replica's cgroup), ``cgroup_parent`` (the Sluice-owned parent, sweeping a dead Sluice's),
``launch`` (the exec shim: cgroup join + parent-death signal), ``replicas`` (one process),
``probe`` (HTTP readiness), ``state`` (statuses and bookkeeping), ``pool`` (desired state
per service, supervision).
"""
