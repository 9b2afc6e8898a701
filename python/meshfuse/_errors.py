"""meshfuse.Error and its subclasses, one per kind of user error. The classes are created by
the C++ extension from the one list of kinds (MESHFUSE_ERROR_KINDS in include/meshfuse/error.h),
so a C++ UserError of kind Shape arrives in Python as meshfuse.ShapeError with the same message.
"""

from . import _C

Error = _C.Error
globals().update({_name: getattr(_C, _name) for _name in _C.ERROR_KINDS})
__all__ = ["Error", *_C.ERROR_KINDS]
