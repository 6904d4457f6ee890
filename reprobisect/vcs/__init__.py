"""Version control: ``git`` (revisions, ranges, worktrees, the session lock, archives; on
GitPython) and ``dvc`` (DVC-tracked data at a revision; DVC itself optional).
"""
