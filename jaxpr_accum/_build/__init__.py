"""Building the chunked region: its named inputs and outputs (``_signature``), the chunk
loop on one device (``_loop``), which body equations run per cell of the row maps
(``_cells``, with its ``Chunk``), the per-chunk results put back in order (``_stack``), one
device or sharded (``_layout``; sharded parameters per chunk: ``_shards``), the
rematerialised backward pass (``_backward``), the fused Jacobian rows (``_jacobians``), the
passes over the whole axis (``_region``) and the region as a JAX primitive with its rules
(``_region_p``)."""
