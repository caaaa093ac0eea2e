/*
 * For building against rdma-core's <rdma/rdma_cma.h> with MinGW-w64:
 * Winsock's sockets.
 */
#ifndef IRPVERBS_MINGW_SYS_SOCKET_H
#define IRPVERBS_MINGW_SYS_SOCKET_H
#include <winsock2.h>
#include <ws2tcpip.h>
#endif
