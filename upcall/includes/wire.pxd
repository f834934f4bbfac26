# Cython declarations of the wire format (csrc/wire.h, docs/wire.md): the
# numbers are defined there only, and read from there here.
from libc.stdint cimport uint32_t, uint64_t

cdef extern from "wire.h" nogil:
    enum:
        # ext codes
        UC_EXT_OOB
        UC_EXT_COALESCED
        # frames
        UC_WIRE_FIRST_OOB_FRAME
        UC_WIRE_MAX_FRAMES
        UC_WIRE_MAX_OOB
        # the out-of-band reference
        UC_OOB_REF_SIZE
        UC_OOB_VERSION
        UC_OOB_CODEC_MASK
        UC_OOB_CODEC_NONE
        UC_OOB_CODEC_LZ4
        UC_OOB_CODEC_ZSTD
        UC_OOB_CODEC_LAST
        # the coalesced batch
        UC_BATCH_VERSION
        UC_BATCH_MARKER
        UC_BATCH_HEADER
        UC_BATCH_EXT_HEAD
        # the marker frame
        UC_MARK_SIZE
        UC_MARK_STAMPED_SIZE
        UC_MARK_VERSION
        UC_MARK_STAMPED
        # faults
        UC_WIRE_ERR_BATCH_VERSION
        UC_WIRE_ERR_BATCH_LENGTH
        UC_WIRE_ERR_BATCH_OOB
        UC_WIRE_ERR_OOB_LENGTH
        UC_WIRE_ERR_OOB_VERSION
        UC_WIRE_ERR_OOB_FLAGS
        UC_WIRE_ERR_OOB_INDEX
        UC_WIRE_ERR_OOB_TWICE
        UC_WIRE_ERR_OOB_SIZE
        UC_WIRE_ERR_OOB_UNUSED
        UC_WIRE_ERR_COALESCED
        UC_WIRE_ERR_OOB_CODEC
        UC_WIRE_ERR_OOB_DECOMPRESS
        UC_WIRE_ERR_MSG_SIZE

    ctypedef struct uc_oob_ref:
        unsigned version
        unsigned flags
        unsigned codec
        uint64_t index
        uint64_t size

    int uc_wire_ext_marker(unsigned char b)
    void uc_oob_ref_pack(unsigned char *out, uint32_t index, uint64_t size, unsigned codec)
    void uc_oob_ref_set_codec(unsigned char *ref, unsigned codec)
    int uc_oob_ref_unpack(const void *data, size_t len, uc_oob_ref *ref)
    int uc_batch_header_pack(unsigned char *h, size_t total)

    ctypedef struct uc_mark:
        int stamped
        uint64_t stream
        uint64_t seq
        uint32_t count

    size_t uc_mark_pack(unsigned char *out, int stamped, uint64_t stream, uint64_t seq,
                        uint32_t count)
    int uc_mark_unpack(const void *data, size_t len, uc_mark *m)
