"""Reconciler tests: the real operator and a real apiserver, with a play-kubelet running workspace pods."""
