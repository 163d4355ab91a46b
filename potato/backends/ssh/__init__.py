"""The ssh backend type's steps and checks; its declaration is potato.backend_types.ssh."""
