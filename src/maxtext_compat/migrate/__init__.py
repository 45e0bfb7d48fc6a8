"""`maxtext-compat migrate`: a libcst codemod that moves call sites between MaxText's two call conventions."""
