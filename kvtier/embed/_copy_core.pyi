"""Types of the compiled row copies (`_copy_core.pyx`) for mypy."""

import numpy as np
import numpy.typing as npt

def copy_spans(
    targets: npt.NDArray[np.int64], sources: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
) -> None: ...
