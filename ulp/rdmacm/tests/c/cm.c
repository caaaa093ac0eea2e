/* The librdmacm API over irpverbs in one process, built against rdma-core's
 * <rdma/rdma_cma.h> and linked with librdmacm.so.1 and libibverbs.so.1
 * (ulp/ibverbs/link.sh): rdma-core's errno for bad arguments and calls out
 * of sequence, a non-blocking, polled event channel, the events of a
 * connection in rdma_cm's order with private data both ways, the peer's
 * address and port learnt from the IP CM header, a rejected connect with
 * its private data, a connect to a port no one listens on, a disconnect
 * seen by both sides. Prints "N passed, 0 failed" when all hold. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

static int passed, failed;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (cond) {                                                                  \
            passed++;                                                                \
        } else {                                                                     \
            failed++;                                                                \
            fprintf(stderr, "%s:%d: failed: %s (errno %d)\n", __FILE__, __LINE__, #cond, \
                    errno);                                                          \
        }                                                                            \
    } while (0)

/* -1 and errno e. */
#define FAILS_WITH(call, e) CHECK((call) == -1 && errno == (e))

static struct sockaddr_in sin_of(const char *ip, int port)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
}

/* The channel's next event (waiting at most 10 s in poll), which must be
 * of type `want`; NULL otherwise. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
    struct pollfd p = {.fd = ch->fd, .events = POLLIN};
    struct rdma_cm_event *ev = NULL;
    if (poll(&p, 1, 10000) != 1) {
        fprintf(stderr, "no event (wanted %s)\n", rdma_event_str(want));
        return NULL;
    }
    if (rdma_get_cm_event(ch, &ev)) {
        fprintf(stderr, "rdma_get_cm_event: errno %d\n", errno);
        return NULL;
    }
    if (ev->event != want) {
        fprintf(stderr, "event %s (status %d), wanted %s\n", rdma_event_str(ev->event),
                ev->status, rdma_event_str(want));
        rdma_ack_cm_event(ev);
        return NULL;
    }
    return ev;
}

static int expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
    struct rdma_cm_event *ev = next_event(ch, want);
    if (!ev)
        return 0;
    rdma_ack_cm_event(ev);
    return 1;
}

static void bad_arguments(struct rdma_event_channel *ch)
{
    struct rdma_cm_id *id = NULL, *other = NULL;
    struct rdma_cm_event *ev;
    struct sockaddr_in a;
    struct sockaddr_un un;
    struct ibv_qp_init_attr qa;
    struct rdma_addrinfo hints, *res = NULL;
    int v = 1;
    uint8_t big = 99;

    FAILS_WITH(rdma_create_id(ch, NULL, NULL, RDMA_PS_TCP), EINVAL);
    FAILS_WITH(rdma_create_id(ch, &id, NULL, (enum rdma_port_space)0x9999), EINVAL);
    CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
    FAILS_WITH(rdma_bind_addr(id, NULL), EINVAL);
    memset(&un, 0, sizeof un);
    un.sun_family = AF_UNIX;
    FAILS_WITH(rdma_bind_addr(id, (struct sockaddr *)&un), EAFNOSUPPORT);
    a = sin_of("10.9.9.9", 7000);
    FAILS_WITH(rdma_bind_addr(id, (struct sockaddr *)&a), EADDRNOTAVAIL);
    FAILS_WITH(rdma_resolve_route(id, 1000), EINVAL);
    FAILS_WITH(rdma_connect(id, NULL), EINVAL);
    FAILS_WITH(rdma_accept(id, NULL), EINVAL);
    FAILS_WITH(rdma_reject(id, NULL, 0), EINVAL);
    FAILS_WITH(rdma_disconnect(id), EINVAL);
    memset(&qa, 0, sizeof qa);
    FAILS_WITH(rdma_create_qp(id, NULL, &qa), EINVAL); /* on no device yet */
    FAILS_WITH(rdma_create_qp(id, NULL, NULL), EINVAL);
    FAILS_WITH(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &v, 1), EINVAL);
    FAILS_WITH(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &big, 1), EINVAL);
    FAILS_WITH(rdma_set_option(id, 77, 0, &v, sizeof v), ENOSYS);
    CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &v, sizeof v) == 0);
    FAILS_WITH(rdma_init_qp_attr(id, NULL, NULL), EINVAL);

    /* Two listeners on one port and address: the second is refused. */
    a = sin_of("127.0.0.1", 7001);
    CHECK(rdma_bind_addr(id, (struct sockaddr *)&a) == 0);
    FAILS_WITH(rdma_bind_addr(id, (struct sockaddr *)&a), EINVAL);
    CHECK(ntohs(rdma_get_src_port(id)) == 7001);
    CHECK(rdma_listen(id, 1) == 0);
    CHECK(rdma_create_id(ch, &other, NULL, RDMA_PS_TCP) == 0);
    CHECK(rdma_bind_addr(other, (struct sockaddr *)&a) == 0);
    FAILS_WITH(rdma_listen(other, 1), EADDRINUSE);
    CHECK(rdma_destroy_id(other) == 0);
    CHECK(rdma_destroy_id(id) == 0);

    FAILS_WITH(rdma_get_cm_event(NULL, &ev), EINVAL);
    FAILS_WITH(rdma_get_cm_event(ch, NULL), EINVAL);
    FAILS_WITH(rdma_get_cm_event(ch, &ev), EAGAIN); /* non-blocking, empty */
    FAILS_WITH(rdma_ack_cm_event(NULL), EINVAL);
    FAILS_WITH(rdma_destroy_id(NULL), EINVAL);
    FAILS_WITH(rdma_connect(NULL, NULL), EINVAL);

    FAILS_WITH(rdma_getaddrinfo(NULL, NULL, NULL, &res), EINVAL);
    memset(&hints, 0, sizeof hints);
    hints.ai_flags = RAI_PASSIVE;
    CHECK(rdma_getaddrinfo("127.0.0.1", "7002", &hints, &res) == 0);
    if (res) {
        CHECK(res->ai_port_space == RDMA_PS_TCP && res->ai_qp_type == IBV_QPT_RC);
        CHECK(res->ai_src_addr && res->ai_src_addr->sa_family == AF_INET && !res->ai_dst_addr);
        CHECK(ntohs(((struct sockaddr_in *)res->ai_src_addr)->sin_port) == 7002);
        rdma_freeaddrinfo(res);
    }
    rdma_freeaddrinfo(NULL);
}

static struct rdma_cm_id *active(struct rdma_event_channel *ch, int port, struct ibv_pd **pd)
{
    struct rdma_cm_id *id = NULL;
    struct sockaddr_in dst = sin_of("127.0.0.1", port);
    struct ibv_qp_init_attr qa;
    if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
        return NULL;
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
    CHECK(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
    CHECK(id->verbs != NULL);
    CHECK(rdma_resolve_route(id, 2000) == 0);
    CHECK(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
    CHECK(id->route.num_paths == 1 && id->route.path_rec != NULL);
    if (!*pd)
        *pd = ibv_alloc_pd(id->verbs);
    memset(&qa, 0, sizeof qa);
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    CHECK(rdma_create_qp(id, *pd, &qa) == 0);
    CHECK(id->qp && id->send_cq && id->recv_cq && id->recv_cq_channel);
    return id;
}

static void connection(struct rdma_event_channel *ch)
{
    struct rdma_cm_id *listener = NULL, *conn, *id;
    struct rdma_cm_event *ev;
    struct sockaddr_in a = sin_of("127.0.0.1", 7003);
    struct rdma_conn_param cp;
    struct ibv_qp_init_attr qa;
    struct ibv_pd *pd = NULL;
    char peer[INET_ADDRSTRLEN] = "";
    uint16_t active_port;

    CHECK(rdma_create_id(ch, &listener, (void *)0x1234, RDMA_PS_TCP) == 0);
    CHECK(rdma_bind_addr(listener, (struct sockaddr *)&a) == 0);
    CHECK(rdma_listen(listener, 4) == 0);

    id = active(ch, 7003, &pd);
    if (!id)
        return;
    active_port = rdma_get_src_port(id);
    memset(&cp, 0, sizeof cp);
    cp.private_data = "hello";
    cp.private_data_len = 6;
    cp.responder_resources = 1;
    cp.initiator_depth = 1;
    cp.retry_count = 7;
    CHECK(rdma_connect(id, &cp) == 0);
    FAILS_WITH(rdma_connect(id, &cp), EINVAL);

    ev = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    CHECK(ev != NULL);
    if (!ev)
        return;
    conn = ev->id;
    CHECK(ev->listen_id == listener && conn->context == (void *)0x1234);
    CHECK(ev->param.conn.private_data_len >= 6 &&
          !strcmp((const char *)ev->param.conn.private_data, "hello"));
    CHECK(ev->param.conn.qp_num == id->qp->qp_num);
    /* The peer's address and port, from the IP CM header. */
    inet_ntop(AF_INET, &((struct sockaddr_in *)rdma_get_peer_addr(conn))->sin_addr, peer,
              sizeof peer);
    CHECK(!strcmp(peer, "127.0.0.1"));
    CHECK(rdma_get_dst_port(conn) == active_port);
    CHECK(ntohs(rdma_get_src_port(conn)) == 7003);
    rdma_ack_cm_event(ev);

    memset(&qa, 0, sizeof qa);
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    CHECK(rdma_create_qp(conn, pd, &qa) == 0);
    memset(&cp, 0, sizeof cp);
    cp.private_data = "world";
    cp.private_data_len = 6;
    cp.responder_resources = 200; /* more than the device has */
    FAILS_WITH(rdma_accept(conn, &cp), EINVAL);
    cp.responder_resources = 1;
    cp.initiator_depth = 1;
    CHECK(rdma_accept(conn, &cp) == 0);

    /* Both ESTABLISHED, in either order. */
    for (int i = 0; i < 2; i++) {
        ev = next_event(ch, RDMA_CM_EVENT_ESTABLISHED);
        CHECK(ev != NULL);
        if (!ev)
            return;
        if (ev->id == id)
            CHECK(ev->param.conn.private_data_len >= 6 &&
                  !strcmp((const char *)ev->param.conn.private_data, "world"));
        else
            CHECK(ev->id == conn);
        rdma_ack_cm_event(ev);
    }

    /* A disconnect: both sides see DISCONNECTED. */
    CHECK(rdma_disconnect(id) == 0);
    for (int i = 0; i < 2; i++)
        CHECK(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
    CHECK(rdma_disconnect(conn) == 0); /* already disconnected: nothing more */
    rdma_destroy_qp(conn);
    CHECK(rdma_destroy_id(conn) == 0);
    rdma_destroy_qp(id);
    CHECK(rdma_destroy_id(id) == 0);

    /* A rejected connect, with the reject's private data. */
    id = active(ch, 7003, &pd);
    if (!id)
        return;
    CHECK(rdma_connect(id, NULL) == 0);
    ev = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    CHECK(ev != NULL);
    if (!ev)
        return;
    conn = ev->id;
    rdma_ack_cm_event(ev);
    CHECK(rdma_reject(conn, "no", 3) == 0);
    FAILS_WITH(rdma_reject(conn, "no", 3), EINVAL);
    ev = next_event(ch, RDMA_CM_EVENT_REJECTED);
    CHECK(ev != NULL);
    if (ev) {
        CHECK(ev->id == id && ev->status == 28); /* consumer reject */
        CHECK(ev->param.conn.private_data_len >= 3 &&
              !strcmp((const char *)ev->param.conn.private_data, "no"));
        rdma_ack_cm_event(ev);
    }
    CHECK(rdma_destroy_id(conn) == 0);
    rdma_destroy_qp(id);
    CHECK(rdma_destroy_id(id) == 0);

    /* No listener on the port: REJECTED, invalid service ID (8). */
    id = active(ch, 7004, &pd);
    if (!id)
        return;
    CHECK(rdma_connect(id, NULL) == 0);
    ev = next_event(ch, RDMA_CM_EVENT_REJECTED);
    CHECK(ev != NULL && ev->status == 8);
    if (ev)
        rdma_ack_cm_event(ev);
    rdma_destroy_qp(id);
    CHECK(rdma_destroy_id(id) == 0);

    CHECK(rdma_destroy_id(listener) == 0);
    CHECK(ibv_dealloc_pd(pd) == 0);
}

int main(void)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();
    CHECK(ch != NULL);
    if (!ch)
        return 1;
    CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
    bad_arguments(ch);
    connection(ch);
    rdma_destroy_event_channel(ch);
    rdma_destroy_event_channel(NULL);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
