/* The receiver of the --bus publishing rows: counts messages, coalesced or not.
 *
 *     count_pull ENDPOINT N
 *
 * Binds a PULL and receives until N messages have arrived (or nothing came
 * for 5 s), then prints {"delivered": D, "zmq_messages": Z, "bad": B}.  A
 * payload that is a coalesced message (docs/wire.md, ext 127: c9 <u32 BE
 * length> 7f 01 <msgpack objects>) counts as the objects it holds, walked
 * with the core's own bounds-checked reader (csrc/msgpack.c, mp_skip); any
 * other payload counts as one message.  A malformed coalesced payload counts
 * the objects before the fault and one "bad".  It only counts, so that the
 * publishing rows measure the sender, and lost = N - delivered.
 */
#include <stdint.h>

#include "floor.h"
#include "msgpack.h"
#include "wire.h"

/* Messages in one payload; *bad set when a coalesced one is malformed. */
static long count_payload(const unsigned char *p, size_t len, int *bad)
{
    if (len < UC_BATCH_HEADER || p[0] != UC_BATCH_MARKER || p[5] != UC_EXT_COALESCED)
        return 1;
    uint32_t ext_len = mp__be32(p + 1);
    if ((size_t)ext_len + UC_BATCH_EXT_HEAD != len || p[6] != UC_BATCH_VERSION) {
        *bad = 1;
        return 0;
    }
    mp_reader r;
    mp_reader_init(&r, (const char *)p + UC_BATCH_HEADER, len - UC_BATCH_HEADER);
    long k = 0;
    while (r.pos < r.len) {
        if (mp_skip(&r, MP_SKIP_MAX_DEPTH) != MP_OK) {
            *bad = 1;
            break;
        }
        k++;
    }
    return k;
}

int main(int argc, char **argv)
{
    floor_rx rx;
    int rc = floor_rx_open(&rx, argc, argv, "count_pull ENDPOINT N");
    if (rc != 0)
        return rc;
    printf("ready\n");
    fflush(stdout);
    long delivered = 0, zmq_messages = 0, bad = 0;
    int frame = 0;
    while (delivered < rx.n) {
        if (zmq_msg_recv(&rx.msg, rx.sock, 0) < 0)
            break;                                  /* stalled (or interrupted) */
        if (frame == 1) {                           /* [topic, payload, ...]: the payload */
            int b = 0;
            delivered += count_payload(zmq_msg_data(&rx.msg), zmq_msg_size(&rx.msg), &b);
            bad += b;
        }
        frame++;
        if (!zmq_msg_more(&rx.msg)) {
            if (frame == 1)
                delivered++;                        /* a single-frame message */
            frame = 0;
            zmq_messages++;
        }
    }
    printf("{\"delivered\": %ld, \"zmq_messages\": %ld, \"bad\": %ld}\n",
           delivered, zmq_messages, bad);
    fflush(stdout);
    floor_rx_close(&rx);
    return 0;
}
