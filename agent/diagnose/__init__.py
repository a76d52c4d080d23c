"""The SRE checklist for a slow GPU node, run from the agent's own sources.

``gpufleet diagnose`` on a node, and the agent at start and on change (its
node facts), run the same checks: PCIe link generation and width against the
maximum, clocks-event reasons, CPU governor, the job's CPU quota against the
cores its GPUs need, GPU NUMA node against the CPUs its processes may run on,
iowait, NFS RPC stalls, NVLink against PCIe traffic.  Each check states its
finding, the number behind it and the decision it implies.

* :mod:`.view`: what is read (GPU rows and facts from the GPU source, ``/proc``,
  ``/sys``, cgroups, ``mountstats``), sampled twice for rates;
* :mod:`.checks`: the checks, pure functions of a :class:`~.view.NodeView`;
* :mod:`.report`: the table, the JSON, and the node facts the agent sends.
"""
