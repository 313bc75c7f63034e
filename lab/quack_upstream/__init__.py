"""The C-load warp in the form it could be offered to quack (issue 16, section 3): a
generator of the patch against the installed quack-kernels 0.6.5 (make_patch.py), the
quack-side GPU test and the patch's description (the two templates beside it)."""
