/* The codec table (codec.h): a codec is one row here. */
#include "codec.h"

#include <string.h>

/* The rows, one per codec_<name>.c, in the order upcall.COMPRESSION lists
 * them. */
extern const uc_codec uc_codec_lz4, uc_codec_zstd;
static const uc_codec *const table[] = {
    &uc_codec_lz4,
    &uc_codec_zstd,
};

size_t uc_codec_count(void)
{
    return sizeof table / sizeof table[0];
}

const uc_codec *uc_codec_at(size_t i)
{
    return i < uc_codec_count() ? table[i] : NULL;
}

const uc_codec *uc_codec_by_name(const char *name)
{
    for (size_t i = 0; name && i < uc_codec_count(); i++)
        if (strcmp(table[i]->name, name) == 0)
            return table[i];
    return NULL;
}

const uc_codec *uc_codec_by_id(unsigned id)
{
    for (size_t i = 0; id != UC_OOB_CODEC_NONE && i < uc_codec_count(); i++)
        if (table[i]->id == id)
            return table[i];
    return NULL;
}
