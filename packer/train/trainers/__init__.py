"""The loss and the trainers: ``loss`` (``packed_cross_entropy``, normalizations, DPO log-probs), ``metrics``
(per-source logging), ``step`` (what every trainer's ``compute_loss`` does alike), ``trainer`` (``PackedTrainer``,
``PackedCollator``), ``trl`` (``PackedSFTTrainer``, ``PackedDPOTrainer``) and ``grpo`` (``PackedGRPOTrainer``: TRL's
GRPO with each group a prefix tree)."""
