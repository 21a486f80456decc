"""Past one machine (`--cluster`, docs/SCALE.md): a run's blocks as Ray tasks, one block whole on
one node (connect.py, node.py, blocks.py), and load from several client hosts against one
server (clients.py, clock.py). Ray is an optional dependency (the `cluster` extra): nothing
here is imported unless --cluster or --clients is given."""
