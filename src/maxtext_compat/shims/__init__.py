"""Reversible monkeypatches that give an installed MaxText the convention a user needs."""
