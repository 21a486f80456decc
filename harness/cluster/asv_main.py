"""`python -m harness.cluster.asv_main MACHINE_FILE ARGS...`: asv's command line with its machine
file at MACHINE_FILE instead of ~/.asv-machine.json.

`asv run` rewrites the machine file as it starts, in place (truncated, then written): two
commits recorded at once on one node (a task a GPU, `bench nightly --cluster`) would read
each other's half-written file. Each task gives asv a file of its own holding the driver's
machine entry (nightly.py), so its results name the machine a local night names."""

from __future__ import annotations

import sys

from asv.machine import MachineCollection
from asv.main import main

if __name__ == "__main__":
    path = sys.argv.pop(1)
    MachineCollection.get_machine_file_path = staticmethod(lambda: path)
    main()
