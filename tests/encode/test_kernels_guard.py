"""The encode's numba kernels read their tables unchecked: an id past the tokenizer's tables is refused before them
(packer/encode/kernels.py ``check_ids``), never read as a stray byte length or control-token flag."""

import numpy as np
import pytest

from packer.encode.kernels import check_ids
from packer.encode.tokenize import ByteOffsets


def test_an_id_past_the_tables_is_refused():
    lengths = np.array([1, 2, 3], dtype=np.int32)
    assert ByteOffsets(np.array([0, 2, 1], dtype=np.int32), [0, 3], lengths).start.tolist() == [0, 1, 4, 6]
    with pytest.raises(ValueError, match="outside the tokenizer's 3 ids"):
        ByteOffsets(np.array([0, 3], dtype=np.int32), [0, 2], lengths)
    with pytest.raises(ValueError, match="outside"):
        check_ids(np.array([-1], dtype=np.int32), 3)
    check_ids(np.array([], dtype=np.int32), 3)
