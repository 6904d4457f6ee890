"""Code that runs inside the user's training process: launcher and framework recorders.

Each framework module is imported lazily, only once the user's script imports that
framework.
"""
