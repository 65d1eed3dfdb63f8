"""The executors of the contract suite: the DataLoader keywords that choose each one."""

#: executor -> the DataLoader keywords that choose it (``{address}``: the Ray cluster's)
EXECUTORS = {
    "processes": dict(num_workers=2),
    "threads": dict(num_workers=2, worker_method="thread"),
    "threads_in_processes": dict(num_workers=2, threads_per_worker=2),
    "ray": dict(num_workers=2, worker_method="ray"),
}
#: the executors whose workers are processes (a worker can die, and be replaced)
PROCESS_BASED = ["processes", "threads_in_processes", "ray"]
