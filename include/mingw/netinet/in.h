/*
 * For building against rdma-core's <rdma/rdma_cma.h> with MinGW-w64: the
 * socket addresses are Winsock's (AF_INET6 is 23 there).
 */
#ifndef IRPVERBS_MINGW_NETINET_IN_H
#define IRPVERBS_MINGW_NETINET_IN_H
#include <winsock2.h>
#include <ws2tcpip.h>
#endif
