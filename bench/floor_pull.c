/* The physical floor of the --bus throughput rows: a plain C libzmq PULL loop.
 *
 *     floor_pull ENDPOINT N
 *
 * Binds a PULL socket to ENDPOINT (the peer's flood is already queued on a
 * PUSH that connects to it), receives N messages of any number of frames
 * with zmq_msg_recv into one reused zmq_msg_t, and prints one JSON line:
 * {"delivered": D, "seconds": S, "cpu": C}, where S and C (this process's
 * CPU time, libzmq's I/O thread included: getrusage) run from the first
 * message to the N-th, the same span the Python rows time.  No decoding and
 * no call per message: what receiving alone costs.  Gives up after 5 s
 * without a message (delivered < N then).
 */
#include "floor.h"

int main(int argc, char **argv)
{
    floor_rx rx;
    int rc = floor_rx_open(&rx, argc, argv, "floor_pull ENDPOINT N");
    if (rc != 0)
        return rc;
    long n = rx.n;
    long delivered = 0;
    double t0 = 0, c0 = 0, t1 = 0, c1 = 0;
    while (delivered < n) {
        if (zmq_msg_recv(&rx.msg, rx.sock, 0) < 0)
            break;                                  /* stalled (or interrupted) */
        if (zmq_msg_more(&rx.msg))
            continue;                               /* a message ends with its last frame */
        delivered++;
        if (delivered == 1) {
            t0 = now_s();
            c0 = cpu_s();
        }
    }
    t1 = now_s();
    c1 = cpu_s();
    printf("{\"delivered\": %ld, \"seconds\": %.9f, \"cpu\": %.9f}\n",
           delivered, delivered > 1 ? t1 - t0 : 0.0, delivered > 1 ? c1 - c0 : 0.0);
    fflush(stdout);
    floor_rx_close(&rx);
    return 0;
}
