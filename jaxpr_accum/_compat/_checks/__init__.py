"""``jax.experimental.checkify`` through the chunk loops: a serialized function reports what
the original reports.

- ``_rules``: the ``checkify`` rules of the region, of its ``shard_map``, of the chunk loop's
  equation and of ``jax.checkpoint`` (the region's checks are kept, checked per element and
  per device);
- ``_loops``: JAX's interpreter of a jaxpr under ``checkify``, replaced by one that checks
  each run of a chunk loop's equations with one error slot per check site and merges them in
  the original's order;
- ``_sites``: those slots and their clock;
- ``_merges``: how a loop's slots join the error, under codes in the original's order;
- ``_places``: which check site a check is (its place in the user's program);
- ``_entry``: what a loop's forward pass was entered with, for its backward pass.

Importing the package installs the interpreter and the rules; outside ``checkify`` nothing
here runs.
"""
