# Argument checks shared by upcall's modules: one place for each rule.
#
# A wrong argument raises TypeError (wrong type) or ValueError (wrong value),
# naming the argument and, for a range, stating the whole range.  These are
# cdef inline functions, so each module that cimports them compiles its own
# copy and no module has to be imported for them at run time.
from cpython.float cimport PyFloat_AsDouble
from cpython.number cimport PyIndex_Check, PyNumber_Index
from libc.math cimport ceil, isinf

# The longest timeout the C core takes: its milliseconds are a C int.
cdef enum:
    MAX_TIMEOUT_MS = 2147483647


cdef inline object int_arg(object value, str name, object low, object high,
                           str note=None, bint or_none=False):
    """``value`` as an int in ``low..high`` (``high`` None: no upper bound).

    Any integer type with ``__index__`` (numpy's too) except bool.  With
    ``or_none``, None is accepted and returned as it is.  ``note`` says what
    special values mean, e.g. "0: no limit", and is added to the messages.
    """
    if value is None and or_none:
        return None
    if isinstance(value, bool) or not PyIndex_Check(value):
        raise TypeError(f"{name} must be an int{' or None' if or_none else ''}"
                        f"{f' ({note})' if note else ''}, not {type(value).__name__}")
    value = PyNumber_Index(value)
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise ValueError(f"{name} must be {bounds}{f' ({note})' if note else ''}, not {value!r}")
    return value


cdef inline str _timeout_expected(str name, str got):
    return (f"{name} must be a number of seconds between 0 and {MAX_TIMEOUT_MS / 1000}, "
            f"or None or math.inf for no limit, {got}")


cdef inline int timeout_ms(object timeout, str name) except -2:
    """A timeout in seconds as whole milliseconds for the C core, rounded up.

    None and math.inf mean no limit (-1).  Otherwise an int or float from 0
    to MAX_TIMEOUT_MS / 1000 seconds (about 24.8 days): a longer one would
    not fit the core's milliseconds, and is refused rather than shortened.
    """
    cdef double t, ms
    if timeout is None:
        return -1
    if isinstance(timeout, (bool, str, bytes, bytearray)):
        raise TypeError(_timeout_expected(name, f"not {type(timeout).__name__}"))
    try:
        t = PyFloat_AsDouble(timeout)
    except TypeError:
        raise TypeError(_timeout_expected(name, f"not {type(timeout).__name__}")) from None
    except OverflowError:           # an int beyond any double: far out of range
        raise ValueError(_timeout_expected(name, f"not {timeout!r}")) from None
    if isinf(t) and t > 0:
        return -1
    ms = ceil(t * 1000.0)
    if not (t >= 0 and ms <= MAX_TIMEOUT_MS):      # NaN fails too
        raise ValueError(_timeout_expected(name, f"not {timeout!r}"))
    return <int>ms


cdef inline bytes c_string(str value, str name):
    """``value`` as UTF-8 for a NUL-terminated C string.

    A NUL inside it would silently end the string early in C ("inproc://a\\0b"
    would bind "inproc://a"), so it is refused.
    """
    cdef bytes b
    try:
        b = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} cannot be encoded as UTF-8 ({exc.reason}): {value!r}") from None
    if b"\0" in b:
        raise ValueError(f"{name} must not contain a NUL character, which would end it "
                         f"early in C: {value!r}")
    return b
