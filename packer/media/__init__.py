"""Media files: what a record's images are, read without any model's knowledge (video will join here)."""
