"""The launch layer `suite sweep` and `suite tune` share: submitit executors for the local and
SLURM launchers (executors, profiles, config), the job wrapper that requeues on preemption
(job), the driver guard that stops its jobs when it stops (guard), the live progress line
(progress), what the scheduler says of a job (slurm), and the state files (state_files, fileio).
It imports neither sweep nor tune, and no backend."""
