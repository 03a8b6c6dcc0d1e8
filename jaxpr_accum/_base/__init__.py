"""The base layer: what every other layer may import, and which imports nothing of the
package but ``_compat``: the errors and ``PlanWarning`` (``_errors``), the analysis lattice
(``_lattice``), the array, key and float predicates and which dtypes carry gradients
(``_dtypes``), validated settings (``_settings``), Flax NNX state (``_nnx``), the per-leaf
comparison of two results with its tolerances by dtype (``_compare``), the install command
for an optional extra (``_install``), and small utilities: an LRU cache (``_lru``), flat
lists picked by flags (``_lists``) and the garbage collector paused while planning
(``_collector``)."""
