/*
 * An ibverbs and rdma_cm program for Windows x64, built with MinGW-w64
 * against rdma-core's unmodified <infiniband/verbs.h> and <rdma/rdma_cma.h>
 * (include/mingw first on the include path) and linked with the import
 * libraries of libibverbs.dll and librdmacm.dll (ulp/ibverbs/link.sh
 * --windows). .ci/run builds it; nothing here runs Windows binaries.
 *
 * It opens irpverbs0, queries it, creates a PD, an MR, a completion channel
 * and a CQ on it, arms the CQ and polls it (the inline speed path through
 * context->ops), waits on the channel's event HANDLE, creates an RC QP and
 * moves it to INIT, then an rdma_cm event channel and id; it tears all of
 * it down. Exit code 0 means every call succeeded.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* rdma_cma.h brings Winsock (include/mingw), which goes before windows.h. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <windows.h>

#define CHECK(cond, what)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s (errno %d)\n", __FILE__, __LINE__, what, errno);       \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* The event HANDLE an rdma-core "fd" holds on Windows. */
static HANDLE fd_handle(int fd) {
    return (HANDLE)(intptr_t)fd;
}

int main(void) {
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 1, "ibv_get_device_list");
    CHECK(strcmp(ibv_get_device_name(list[0]), "irpverbs0") == 0, "ibv_get_device_name");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx, "ibv_open_device");
    ibv_free_device_list(list);

    struct ibv_device_attr attr;
    CHECK(ibv_query_device(ctx, &attr) == 0, "ibv_query_device");
    struct ibv_port_attr port;
    CHECK(ibv_query_port(ctx, 1, &port) == 0, "ibv_query_port");
    union ibv_gid gid;
    CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "ibv_query_gid");

    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd");
    static char buf[4096];
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr, "ibv_reg_mr");

    struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
    CHECK(ch, "ibv_create_comp_channel");
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, ch, 0);
    CHECK(cq, "ibv_create_cq");
    CHECK(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");
    struct ibv_wc wc;
    CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "ibv_poll_cq");
    /* Nothing completed: the channel's event is not signaled. */
    CHECK(WaitForSingleObject(fd_handle(ch->fd), 0) == WAIT_TIMEOUT, "channel signaled");

    struct ibv_qp_init_attr qpa = {
        .send_cq = cq,
        .recv_cq = cq,
        .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    struct ibv_qp *qp = ibv_create_qp(pd, &qpa);
    CHECK(qp, "ibv_create_qp");
    struct ibv_qp_attr mod;
    memset(&mod, 0, sizeof mod);
    mod.qp_state = IBV_QPS_INIT;
    mod.port_num = 1;
    mod.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    CHECK(ibv_modify_qp(qp, &mod, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                      IBV_QP_ACCESS_FLAGS) == 0,
          "ibv_modify_qp INIT");
    struct ibv_sge sge = {(uintptr_t)buf, sizeof buf, mr->lkey};
    struct ibv_recv_wr rwr, *bad = NULL;
    memset(&rwr, 0, sizeof rwr);
    rwr.wr_id = 1;
    rwr.sg_list = &sge;
    rwr.num_sge = 1;
    CHECK(ibv_post_recv(qp, &rwr, &bad) == 0, "ibv_post_recv");

    struct rdma_event_channel *cm = rdma_create_event_channel();
    CHECK(cm, "rdma_create_event_channel");
    CHECK(WaitForSingleObject(fd_handle(cm->fd), 0) == WAIT_TIMEOUT, "cm channel signaled");
    struct rdma_cm_id *id = NULL;
    CHECK(rdma_create_id(cm, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
    rdma_destroy_event_channel(cm);

    CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
    CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
    CHECK(ibv_destroy_comp_channel(ch) == 0, "ibv_destroy_comp_channel");
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
    CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
    CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
    puts("ok");
    return 0;
}
