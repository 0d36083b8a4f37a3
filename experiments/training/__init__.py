"""One training run: its config, the Lightning task and data module, checkpoints, the run
folder and its identity, the thread policy."""
