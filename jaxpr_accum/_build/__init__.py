"""Building the chunked region: its named inputs and outputs (``_signature``), the chunk
loop on one device (``_loop``), one device or sharded (``_layout``), the rematerialised
backward pass (``_backward``), the fused Jacobian rows (``_jacobians``), the passes over
the whole axis (``_region``) and the region as a JAX primitive with its rules
(``_region_p``)."""
