"""The one exception type a user can cause. Its message is a single sentence: what is wrong, what to do."""


class SluiceError(Exception):
    """An error the user can fix (bad path, unsupported model, budget too small, no disk space...)."""
