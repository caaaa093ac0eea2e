/* The libibverbs API over irpverbs in one process, built against rdma-core's
 * <infiniband/verbs.h> and linked with the library (ulp/ibverbs/link.sh):
 * the GID type, the optional access bits, rdma-core's errno for bad input
 * and for destroying an object in use, the extended verbs' fallbacks, and
 * two RC QPs of the context talking with a completion channel whose fd is
 * non-blocking and polled. Prints "N passed, 0 failed" when all hold. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

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

static int to_rts(struct ibv_qp *qp, uint32_t dest_qpn, union ibv_gid gid)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return 1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = 7;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                  IBV_QP_MIN_RNR_TIMER))
        return 2;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 7;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

int main(void)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 1 && list[1] == NULL);
    CHECK(strcmp(ibv_get_device_name(list[0]), "irpverbs0") == 0);
    struct ibv_context *ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    CHECK(ctx != NULL);
    if (!ctx)
        return 1;

    /* Queries: the extended device query falls back; GIDs are RoCE v2. */
    struct ibv_device_attr_ex dx;
    CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0 && dx.orig_attr.phys_port_cnt == 1);
    struct ibv_port_attr port;
    CHECK(ibv_query_port(ctx, 1, &port) == 0 && port.link_layer == IBV_LINK_LAYER_ETHERNET);
    struct ibv_port_attr no_port;
    CHECK(ibv_query_port(ctx, 2, &no_port) == EINVAL);
    struct ibv_gid_entry entry;
    CHECK(ibv_query_gid_ex(ctx, 1, 0, &entry, 0) == 0 && entry.gid_type == IBV_GID_TYPE_ROCE_V2);
    CHECK(entry.gid.raw[10] == 0xff && entry.gid.raw[12] == 127 && entry.gid.raw[15] == 1);
    CHECK(ibv_query_gid_ex(ctx, 1, (uint32_t)port.gid_tbl_len - 1, &entry, 0) == ENODATA);
    CHECK(ibv_query_gid_ex(ctx, 1, (uint32_t)port.gid_tbl_len, &entry, 0) == EINVAL);
    struct ibv_gid_entry table[4];
    CHECK(ibv_query_gid_table(ctx, table, 4, 0) == 1);
    union ibv_gid gid;
    CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0 && memcmp(&gid, &table[0].gid, 16) == 0);
    CHECK(ibv_query_gid(ctx, 1, port.gid_tbl_len, &gid) == -1 && errno == EINVAL);
    CHECK(ibv_query_device(ctx, NULL) == EINVAL);

    /* async_fd is a real fd: nothing to read yet, non-blocking on request. */
    CHECK(fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK) == 0);
    struct pollfd ap = {.fd = ctx->async_fd, .events = POLLIN};
    CHECK(poll(&ap, 1, 0) == 0);
    struct ibv_async_event aev;
    errno = 0;
    CHECK(ibv_get_async_event(ctx, &aev) == -1 && errno == EAGAIN);

    /* Bad input rdma-core checks. */
    errno = 0;
    CHECK(ibv_alloc_pd(NULL) == NULL && errno == EINVAL);
    CHECK(ibv_dealloc_pd(NULL) == EINVAL);

    /* MRs: optional access bits are accepted, on-demand paging is not. */
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd != NULL);
    char *buf = aligned_alloc(4096, 8192);
    memset(buf, 0, 8192);
    unsigned int relaxed = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_RELAXED_ORDERING;
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, 8192, relaxed);
    CHECK(mr != NULL && mr->lkey != 0 && mr->addr == buf && mr->length == 8192);
    errno = 0;
    CHECK(ibv_reg_mr(pd, buf, 8192, IBV_ACCESS_ON_DEMAND) == NULL && errno == EOPNOTSUPP);
    CHECK(ibv_dealloc_pd(pd) == EBUSY);
    errno = 0;
    CHECK(ibv_alloc_mw(pd, IBV_MW_TYPE_1) == NULL && errno == EOPNOTSUPP);

    /* A channel, a CQ on it, two RC QPs on the CQ. */
    struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
    CHECK(ch != NULL && ch->fd >= 0);
    int tag = 0x5eed;
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, &tag, ch, 0);
    CHECK(cq != NULL && cq->cqe >= 16 && cq->channel == ch);
    CHECK(ibv_destroy_comp_channel(ch) == EBUSY);
    struct ibv_cq_init_attr_ex cqx = {.cqe = 4};
    errno = 0;
    CHECK(ibv_create_cq_ex(ctx, &cqx) == NULL && errno == EOPNOTSUPP);

    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.cap.max_send_wr = 4;
    ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ia.cap.max_inline_data = 32;
    ia.qp_type = IBV_QPT_RC;
    struct ibv_qp *a = ibv_create_qp(pd, &ia);
    struct ibv_qp *b = ibv_create_qp(pd, &ia);
    CHECK(a && b && ia.cap.max_send_wr >= 4);
    if (!a || !b)
        return 1;
    CHECK(ibv_destroy_cq(cq) == EBUSY);

    /* RESET to RTS at once is not a transition; a rate limit is unsupported. */
    struct ibv_qp_attr bad;
    memset(&bad, 0, sizeof bad);
    bad.qp_state = IBV_QPS_RTS;
    CHECK(ibv_modify_qp(a, &bad, IBV_QP_STATE) == EINVAL && a->state == IBV_QPS_RESET);
    CHECK(ibv_modify_qp(a, &bad, IBV_QP_STATE | IBV_QP_RATE_LIMIT) == EOPNOTSUPP);

    CHECK(to_rts(a, b->qp_num, gid) == 0 && to_rts(b, a->qp_num, gid) == 0);
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qi;
    CHECK(ibv_query_qp(a, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_RTS);
    CHECK(qi.send_cq == cq && qi.qp_type == IBV_QPT_RC && qa.dest_qp_num == b->qp_num);

    /* The channel's fd: non-blocking, empty, then readable after a send. */
    int fl = fcntl(ch->fd, F_GETFL);
    CHECK(fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0);
    struct ibv_cq *ev_cq = NULL;
    void *ev_ctx = NULL;
    errno = 0;
    CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN);
    CHECK(ibv_req_notify_cq(cq, 0) == 0);

    struct ibv_sge rs = {.addr = (uintptr_t)(buf + 4096), .length = 64, .lkey = mr->lkey};
    struct ibv_recv_wr rw = {.wr_id = 2, .sg_list = &rs, .num_sge = 1}, *bad_rw = NULL;
    CHECK(ibv_post_recv(b, &rw, &bad_rw) == 0);
    strcpy(buf, "hello over irpverbs");
    struct ibv_sge ss = {.addr = (uintptr_t)buf, .length = 20, .lkey = mr->lkey};
    struct ibv_send_wr sw, *bad_sw = NULL;
    memset(&sw, 0, sizeof sw);
    sw.wr_id = 1;
    sw.sg_list = &ss;
    sw.num_sge = 1;
    sw.opcode = IBV_WR_SEND;
    sw.send_flags = IBV_SEND_SIGNALED;
    CHECK(ibv_post_send(a, &sw, &bad_sw) == 0);

    struct pollfd p = {.fd = ch->fd, .events = POLLIN};
    CHECK(poll(&p, 1, 10000) == 1 && (p.revents & POLLIN));
    CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq && ev_ctx == &tag);
    ibv_ack_cq_events(cq, 1);

    struct ibv_wc wc[4];
    int got = 0, sends = 0, recvs = 0;
    for (int spins = 0; got < 2 && spins < 1000000; spins++) {
        int k = ibv_poll_cq(cq, 1, wc); /* one at a time, as latency loops poll */
        CHECK(k >= 0);
        for (int i = 0; i < k; i++) {
            CHECK(wc[i].status == IBV_WC_SUCCESS);
            if (wc[i].opcode == IBV_WC_SEND && wc[i].wr_id == 1)
                sends++;
            if (wc[i].opcode == IBV_WC_RECV && wc[i].wr_id == 2 && wc[i].byte_len == 20 &&
                wc[i].qp_num == b->qp_num)
                recvs++;
        }
        got += k;
    }
    CHECK(sends == 1 && recvs == 1);
    CHECK(strcmp(buf + 4096, "hello over irpverbs") == 0);

    /* Inline sends in one chain: gathered from three SGEs (one empty), and
     * from one; the program's buffers are free again when the post returns. */
    char part1[8] = "inline ", part2[9] = "gathered";
    struct ibv_sge gs[3] = {{.addr = (uintptr_t)part1, .length = 7},
                            {.addr = 0, .length = 0},
                            {.addr = (uintptr_t)part2, .length = 9}};
    char one[6] = "one!!";
    struct ibv_sge os = {.addr = (uintptr_t)one, .length = 6};
    struct ibv_send_wr iw[2];
    memset(iw, 0, sizeof iw);
    iw[0].wr_id = 10;
    iw[0].sg_list = gs;
    iw[0].num_sge = 3;
    iw[0].opcode = IBV_WR_SEND;
    iw[0].send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    iw[0].next = &iw[1];
    iw[1].wr_id = 11;
    iw[1].sg_list = &os;
    iw[1].num_sge = 1;
    iw[1].opcode = IBV_WR_SEND;
    iw[1].send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    struct ibv_sge rs2[2] = {{.addr = (uintptr_t)(buf + 4096), .length = 64, .lkey = mr->lkey},
                             {.addr = (uintptr_t)(buf + 4160), .length = 64, .lkey = mr->lkey}};
    struct ibv_recv_wr rw2[2] = {{.wr_id = 20, .sg_list = &rs2[0], .num_sge = 1, .next = &rw2[1]},
                                 {.wr_id = 21, .sg_list = &rs2[1], .num_sge = 1}};
    CHECK(ibv_post_recv(b, rw2, &bad_rw) == 0);
    CHECK(ibv_post_send(a, iw, &bad_sw) == 0);
    memset(part1, 'x', sizeof part1);
    memset(part2, 'x', sizeof part2);
    memset(one, 'x', sizeof one);
    /* Polled 32 at a time: more than the library takes from the ring at once. */
    struct ibv_wc wc32[32];
    got = 0, sends = 0, recvs = 0;
    for (int spins = 0; got < 4 && spins < 1000000; spins++) {
        int k = ibv_poll_cq(cq, 32, wc32);
        CHECK(k >= 0);
        for (int i = 0; i < k; i++) {
            CHECK(wc32[i].status == IBV_WC_SUCCESS);
            if (wc32[i].opcode == IBV_WC_SEND && (wc32[i].wr_id == 10 || wc32[i].wr_id == 11))
                sends++;
            if (wc32[i].opcode == IBV_WC_RECV && wc32[i].wr_id == 20 && wc32[i].byte_len == 16)
                recvs++;
            if (wc32[i].opcode == IBV_WC_RECV && wc32[i].wr_id == 21 && wc32[i].byte_len == 6)
                recvs++;
        }
        got += k;
    }
    CHECK(sends == 2 && recvs == 2);
    CHECK(strcmp(buf + 4096, "inline gathered") == 0 && strcmp(buf + 4160, "one!!") == 0);

    /* Bad requests are refused with EINVAL, post nothing and name the first
     * not posted: more SGEs than the QP takes, a NULL list, inline data at
     * NULL, more inline data than the QP takes. */
    struct ibv_sge two[2] = {ss, ss};
    struct ibv_send_wr bw;
    memset(&bw, 0, sizeof bw);
    bw.opcode = IBV_WR_SEND;
    bw.sg_list = two;
    bw.num_sge = 2;
    bad_sw = NULL;
    CHECK(ibv_post_send(a, &bw, &bad_sw) == EINVAL && bad_sw == &bw);
    bw.sg_list = NULL;
    bw.num_sge = 1;
    CHECK(ibv_post_send(a, &bw, &bad_sw) == EINVAL);
    bw.send_flags = IBV_SEND_INLINE;
    CHECK(ibv_post_send(a, &bw, &bad_sw) == EINVAL);
    struct ibv_sge at_null = {.addr = 0, .length = 4};
    bw.sg_list = &at_null;
    CHECK(ibv_post_send(a, &bw, &bad_sw) == EINVAL);
    struct ibv_sge gathered_null[2] = {{.addr = (uintptr_t)buf, .length = 4}, at_null};
    bw.sg_list = gathered_null;
    bw.num_sge = 2;
    CHECK(ibv_post_send(a, &bw, &bad_sw) == EINVAL);
    struct ibv_sge big = {.addr = (uintptr_t)buf, .length = 2048};
    bw.sg_list = &big;
    bw.num_sge = 1;
    CHECK(ibv_post_send(a, &bw, &bad_sw) == EINVAL);
    struct ibv_sge bigs[2] = {big, big};
    bw.sg_list = bigs;
    bw.num_sge = 2;
    CHECK(ibv_post_send(a, &bw, &bad_sw) == EINVAL);
    bw.num_sge = -1;
    CHECK(ibv_post_send(a, &bw, &bad_sw) == EINVAL);
    CHECK(ibv_poll_cq(cq, 32, wc32) == 0);

    /* An unknown opcode is refused and names the request. */
    sw.opcode = 77;
    bad_sw = NULL;
    CHECK(ibv_post_send(a, &sw, &bad_sw) == EINVAL && bad_sw == &sw);

    CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
    CHECK(ibv_destroy_cq(cq) == 0);
    CHECK(ibv_destroy_comp_channel(ch) == 0);
    CHECK(ibv_dereg_mr(mr) == 0);
    CHECK(ibv_dealloc_pd(pd) == 0);
    CHECK(ibv_close_device(ctx) == 0);
    free(buf);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
