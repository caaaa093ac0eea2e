/* librdmacm over irpverbs with QPs the program owns, in one process, built
 * against rdma-core's <rdma/rdma_cma.h> and linked with librdmacm.so.1 and
 * libibverbs.so.1 (ulp/ibverbs/link.sh): both sides create their QPs with
 * ibv_create_qp, connect with rdma_connect / rdma_accept without a QP on
 * the id (qp_num in the connection parameters), move them with
 * rdma_init_qp_attr and ibv_modify_qp, the active side answers
 * CONNECT_RESPONSE with rdma_establish, data goes both ways, then a
 * disconnect; and rdma-core's errno for the calls out of sequence.
 * Prints "N passed, 0 failed" when all hold. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* The channel's next event (at most 10 s), which must be of type `want`;
 * NULL otherwise. */
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

/* The program's side of a connection: its own CQ and QP, and memory. */
struct side {
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    char buf[256];
};

static int make_side(struct side *s, struct ibv_pd *pd)
{
    struct ibv_qp_init_attr qa;
    memset(&qa, 0, sizeof qa);
    s->cq = ibv_create_cq(pd->context, 8, NULL, NULL, 0);
    s->mr = ibv_reg_mr(pd, s->buf, sizeof s->buf, IBV_ACCESS_LOCAL_WRITE);
    qa.send_cq = qa.recv_cq = s->cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    s->qp = s->cq && s->mr ? ibv_create_qp(pd, &qa) : NULL;
    return s->qp != NULL;
}

static void free_side(struct side *s)
{
    if (s->qp)
        CHECK(ibv_destroy_qp(s->qp) == 0);
    if (s->mr)
        CHECK(ibv_dereg_mr(s->mr) == 0);
    if (s->cq)
        CHECK(ibv_destroy_cq(s->cq) == 0);
}

/* Moves the side's QP to `state` with the id's attributes. */
static int move(struct rdma_cm_id *id, struct side *s, enum ibv_qp_state state)
{
    struct ibv_qp_attr a;
    int mask = 0;
    memset(&a, 0, sizeof a);
    a.qp_state = state;
    if (rdma_init_qp_attr(id, &a, &mask)) {
        fprintf(stderr, "rdma_init_qp_attr(%d): errno %d\n", state, errno);
        return 0;
    }
    if (a.qp_state != state || !(mask & IBV_QP_STATE))
        return 0;
    errno = ibv_modify_qp(s->qp, &a, mask);
    if (errno) {
        fprintf(stderr, "ibv_modify_qp(%d): errno %d\n", state, errno);
        return 0;
    }
    return 1;
}

static int post_recv(struct side *s, int at)
{
    struct ibv_sge sge = {.addr = (uintptr_t)(s->buf + at), .length = 64, .lkey = s->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
    return ibv_post_recv(s->qp, &wr, &bad) == 0;
}

static int post_send(struct side *s, int at, const char *msg)
{
    struct ibv_sge sge = {.addr = (uintptr_t)(s->buf + at), .length = strlen(msg) + 1,
                          .lkey = s->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
    struct ibv_send_wr *bad = NULL;
    strcpy(s->buf + at, msg);
    return ibv_post_send(s->qp, &wr, &bad) == 0;
}

/* One successful completion of `opcode` on the side's CQ (10 s at most). */
static int completion(struct side *s, enum ibv_wc_opcode opcode)
{
    struct ibv_wc wc;
    for (long i = 0; i < 100000000; i++) {
        int n = ibv_poll_cq(s->cq, 1, &wc);
        if (n < 0)
            return 0;
        if (n == 1)
            return wc.status == IBV_WC_SUCCESS && wc.opcode == opcode;
    }
    return 0;
}

static void connection(struct rdma_event_channel *ch)
{
    struct rdma_cm_id *listener = NULL, *id = NULL, *conn;
    struct rdma_cm_event *ev;
    struct sockaddr_in a = sin_of("127.0.0.1", 7011);
    struct rdma_conn_param cp;
    struct ibv_qp_attr qa;
    struct ibv_pd *pd;
    struct side act, pas;
    int mask;

    memset(&act, 0, sizeof act);
    memset(&pas, 0, sizeof pas);
    CHECK(rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) == 0);
    CHECK(rdma_bind_addr(listener, (struct sockaddr *)&a) == 0);
    CHECK(rdma_listen(listener, 4) == 0);

    CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
    /* Before the address: no device, nothing to give. */
    memset(&qa, 0, sizeof qa);
    qa.qp_state = IBV_QPS_INIT;
    FAILS_WITH(rdma_init_qp_attr(id, &qa, &mask), EINVAL);
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000) == 0);
    ev = next_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    CHECK(ev != NULL);
    if (ev)
        rdma_ack_cm_event(ev);
    CHECK(rdma_resolve_route(id, 2000) == 0);
    ev = next_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
    CHECK(ev != NULL);
    if (!ev)
        return;
    rdma_ack_cm_event(ev);
    pd = ibv_alloc_pd(id->verbs);
    CHECK(pd != NULL);
    if (!pd || !make_side(&act, pd) || !make_side(&pas, pd)) {
        failed++;
        return;
    }
    /* The active QP to INIT before the connect (rdma_cm's attributes). */
    CHECK(move(id, &act, IBV_QPS_INIT));
    /* RTR before the REP, another state, NULL: EINVAL. */
    qa.qp_state = IBV_QPS_RTR;
    FAILS_WITH(rdma_init_qp_attr(id, &qa, &mask), EINVAL);
    qa.qp_state = IBV_QPS_SQD;
    FAILS_WITH(rdma_init_qp_attr(id, &qa, &mask), EINVAL);
    FAILS_WITH(rdma_init_qp_attr(id, &qa, NULL), EINVAL);
    FAILS_WITH(rdma_init_qp_attr(NULL, &qa, &mask), EINVAL);
    /* Nothing to establish yet; no QP and no parameters to connect. */
    FAILS_WITH(rdma_establish(id), EINVAL);
    FAILS_WITH(rdma_establish(NULL), EINVAL);
    FAILS_WITH(rdma_connect(id, NULL), EINVAL);

    memset(&cp, 0, sizeof cp);
    cp.private_data = "own";
    cp.private_data_len = 4;
    cp.responder_resources = 1;
    cp.initiator_depth = 1;
    cp.retry_count = 7;
    cp.rnr_retry_count = 7;
    cp.qp_num = act.qp->qp_num;
    CHECK(rdma_connect(id, &cp) == 0);

    ev = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    CHECK(ev != NULL);
    if (!ev)
        return;
    conn = ev->id;
    CHECK(ev->param.conn.qp_num == act.qp->qp_num);
    CHECK(ev->param.conn.private_data_len >= 4 &&
          !strcmp((const char *)ev->param.conn.private_data, "own"));
    rdma_ack_cm_event(ev);
    /* The passive QP from the request, to RTS before the accept, with a
     * receive posted for the first message. */
    CHECK(move(conn, &pas, IBV_QPS_INIT));
    CHECK(post_recv(&pas, 0));
    CHECK(move(conn, &pas, IBV_QPS_RTR));
    CHECK(move(conn, &pas, IBV_QPS_RTS));
    FAILS_WITH(rdma_establish(conn), EINVAL); /* the passive side has no RTU */
    FAILS_WITH(rdma_accept(conn, NULL), EINVAL); /* no QP, no parameters */
    memset(&cp, 0, sizeof cp);
    cp.private_data = "yes";
    cp.private_data_len = 4;
    cp.responder_resources = 1;
    cp.initiator_depth = 1;
    cp.rnr_retry_count = 7;
    cp.qp_num = pas.qp->qp_num;
    CHECK(rdma_accept(conn, &cp) == 0);

    /* The active side: CONNECT_RESPONSE with the REP's values. */
    ev = next_event(ch, RDMA_CM_EVENT_CONNECT_RESPONSE);
    CHECK(ev != NULL);
    if (!ev)
        return;
    CHECK(ev->id == id && ev->param.conn.qp_num == pas.qp->qp_num);
    CHECK(ev->param.conn.private_data_len >= 4 &&
          !strcmp((const char *)ev->param.conn.private_data, "yes"));
    rdma_ack_cm_event(ev);
    CHECK(move(id, &act, IBV_QPS_RTR));
    CHECK(post_recv(&act, 64));
    CHECK(move(id, &act, IBV_QPS_RTS));
    CHECK(rdma_establish(id) == 0);
    FAILS_WITH(rdma_establish(id), EINVAL); /* once */

    /* The passive side's ESTABLISHED (on the RTU); none on the active. */
    ev = next_event(ch, RDMA_CM_EVENT_ESTABLISHED);
    CHECK(ev != NULL && ev->id == conn);
    if (ev)
        rdma_ack_cm_event(ev);

    /* Data both ways over the program's QPs. */
    CHECK(post_send(&act, 128, "ping"));
    CHECK(completion(&act, IBV_WC_SEND));
    CHECK(completion(&pas, IBV_WC_RECV) && !strcmp(pas.buf, "ping"));
    CHECK(post_send(&pas, 128, "pong"));
    CHECK(completion(&pas, IBV_WC_SEND));
    CHECK(completion(&act, IBV_WC_RECV) && !strcmp(act.buf + 64, "pong"));

    /* A disconnect: both sides see DISCONNECTED; the QPs are the
     * program's to move (to ERR here). */
    CHECK(rdma_disconnect(id) == 0);
    for (int i = 0; i < 2; i++) {
        ev = next_event(ch, RDMA_CM_EVENT_DISCONNECTED);
        CHECK(ev != NULL);
        if (ev)
            rdma_ack_cm_event(ev);
    }
    memset(&qa, 0, sizeof qa);
    qa.qp_state = IBV_QPS_RTS;
    FAILS_WITH(rdma_init_qp_attr(id, &qa, &mask), EINVAL); /* no longer */
    qa.qp_state = IBV_QPS_ERR;
    CHECK(ibv_modify_qp(act.qp, &qa, IBV_QP_STATE) == 0);
    CHECK(ibv_modify_qp(pas.qp, &qa, IBV_QP_STATE) == 0);
    CHECK(rdma_destroy_id(conn) == 0);
    CHECK(rdma_destroy_id(id) == 0);
    CHECK(rdma_destroy_id(listener) == 0);
    free_side(&act);
    free_side(&pas);
    CHECK(ibv_dealloc_pd(pd) == 0);
}

/* An id with a QP of its own: rdma_establish is not for it. */
static void with_a_qp(struct rdma_event_channel *ch)
{
    struct rdma_cm_id *id = NULL;
    struct sockaddr_in a = sin_of("127.0.0.1", 7012);
    struct ibv_qp_init_attr qa;
    struct rdma_cm_event *ev;

    CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000) == 0);
    ev = next_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    CHECK(ev != NULL);
    if (!ev)
        return;
    rdma_ack_cm_event(ev);
    memset(&qa, 0, sizeof qa);
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 1;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    CHECK(rdma_create_qp(id, NULL, &qa) == 0);
    FAILS_WITH(rdma_establish(id), EINVAL);
    rdma_destroy_qp(id);
    CHECK(rdma_destroy_id(id) == 0);
}

int main(void)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();
    CHECK(ch != NULL);
    if (!ch)
        return 1;
    connection(ch);
    with_a_qp(ch);
    rdma_destroy_event_channel(ch);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
