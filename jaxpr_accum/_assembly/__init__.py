"""Assembling the whole program of one decision: the prologue, the chunked region and the
epilogue (``_assemble``), or the function as written."""
