# upcall.Handler: the extension-type target, cimportable by users' Cython code.
#
#     from upcall.handler cimport Handler
#
#     cdef class MyHandler(Handler):
#         cpdef on_message(self, object msg):
#             ...
#
# The bus's trampoline calls on_message through the vtable: a C call, no
# argument tuple, no Python call machinery.  A Python subclass overriding
# on_message works too (Cython's cpdef override path finds it).

cdef class Handler:
    # True: the trampoline hands each batch over as one list to on_batch
    # instead of calling on_message per message (set it in __init__/__cinit__).
    cdef public bint batches
    # One decoded message.
    cpdef on_message(self, object msg)
    # with_topic=True: the topic (bytes) and the message; by default it calls
    # on_message(msg).
    cpdef on_topic_message(self, bytes topic, object msg)
    # batches=True: the decoded messages of one batch (with_topic=True: a list
    # of (topic, msg) tuples); by default it calls on_message for each.
    cpdef on_batch(self, list msgs)


cdef class Counter(Handler):
    # The example handler: counts messages, keeps the last one.
    cdef public Py_ssize_t count
    cdef public object last
