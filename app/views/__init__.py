"""Thin Qt views: each connects to a model/controller in __init__ and updates in private _on_* slots."""
