"""The ISA levels that houchu's C++ CPU kernels are built for."""

from __future__ import annotations

from houchu.cpu import isa

KERNEL_LEVELS = [lv.name for lv in isa.LEVELS if lv.kernels]
