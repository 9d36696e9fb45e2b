"""A run on Kubernetes: a JobSet (or a Kubeflow TrainJob) as a pure function of the plan.

:mod:`.job` resolves what the manifest says, :mod:`.manifest` and :mod:`.trainjob` write
it, :mod:`.pod` is what each pod's ``dtrain agent --init-from`` does first, :mod:`.api`
talks to the cluster (the ``kubernetes`` client, imported only there). docs/kubernetes.md.
"""
