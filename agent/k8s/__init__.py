"""Kubernetes attribution on the node: which pod holds which GPU, and which run that pod belongs to.

* :mod:`.podresources` asks the kubelet (gRPC, ``v1.PodResourcesLister``)
  which container holds which device of a GPU resource;
* :mod:`.devices` turns device-plugin ids (GPU UUIDs, indexes, MIG UUIDs,
  time-slicing replicas) into the agent's GPU indexes and MIG instances;
* :mod:`.pods` reads the pods' labels, annotations and owners from the API
  server with the agent's service account;
* :mod:`.runs` maps a pod to its run (a run-id annotation, else the job's
  controller, else the pod);
* :mod:`.attribution` ties them together behind the attribution step.
"""
