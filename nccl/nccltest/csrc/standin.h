/* Shared between the CUDA driver stand-in (cuda.c → libcuda.so.1) and the
 * NCCL stand-in (nccl.c → libnccl.so.2). "Device" memory is host memory; a
 * stream is a worker thread that runs queued operations in order, so calls
 * are asynchronous and ordered exactly as on a GPU. Built by gorun's tests
 * (nccl/nccltest) because no NCCL loads on the CI machines. */
#ifndef GORUN_STANDIN_H
#define GORUN_STANDIN_H

typedef struct standin_stream standin_stream;

/* standin_stream_of maps a CUstream (NULL: the legacy default stream) to
 * the stream object. */
standin_stream *standin_stream_of(void *cu_stream);

/* standin_enqueue queues fn(arg) on s; it runs after everything queued
 * before it. */
void standin_enqueue(standin_stream *s, void (*fn)(void *), void *arg);

#endif
