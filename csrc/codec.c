/* The codec table (codec.h), built from wire.h's UC_OOB_CODECS rows. */
#include "codec.h"

#include <string.h>

/* The rows, one per codec_<name>.c, in the order of wire.h's
 * UC_OOB_CODECS (the order upcall.COMPRESSION lists them). */
#define DECLARE_ROW(NAME, name, ID) extern const uc_codec uc_codec_##name;
UC_OOB_CODECS(DECLARE_ROW)
#define ROW(NAME, name, ID) &uc_codec_##name,
static const uc_codec *const table[] = {UC_OOB_CODECS(ROW)};
/* Ids 1, 2, ... in the rows' order: the last row's id is the row count
 * (a row out of order, skipped or repeated makes them differ). */
_Static_assert(sizeof table / sizeof table[0] == UC_OOB_CODEC_LAST,
               "wire.h's UC_OOB_CODECS ids must count up from 1 in order");

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
