"""Rows to batches: ``dataset`` (``PackedDataset``), ``collate``, ``rank_shares`` (equal, cost-balanced shares of
an epoch per rank), ``resume``, ``online`` (packing in the DataLoader), ``join`` (equal steps for uneven loaders).
No torch at import: torch is imported where a tensor is made."""
