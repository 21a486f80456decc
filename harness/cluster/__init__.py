"""Past one machine (`--cluster`, docs/SCALE.md): a run's blocks as Ray tasks, one block whole on
one node (connect.py, tasks.py, node.py, blocks.py), a nightly's commits likewise, one commit's
asv run a task (nightly.py, asv_main.py), and load from several client hosts against one
server (clients.py, clock.py). Ray is an optional dependency (the `cluster` extra): nothing
here is imported unless --cluster or --clients is given."""
