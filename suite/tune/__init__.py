"""Hyper-parameter search with Optuna: `suite tune FILE` (docs/tuning.md).

- `spec`: the tune file (base config, search space, objective, sampler, pruner, launcher) and its checks
- `study`: the driver: storage, ask/tell loop over launcher jobs, MLflow parent/child runs
- `worker`: one trial inside its job, reporting held-out accuracy for pruning
- `report`: best trial, importances, figures and a table, logged to MLflow
"""
