/* pmi2prog: a PMI-2 client built against Slurm's libpmi2 (the library
 * `srun --mpi=pmi2` programs use), run under gorun by the tests.
 *
 *   pmi2prog          init; put a card; fence; read every rank's card, the
 *                     process mapping and a node attribute put by the
 *                     host's first rank (waiting for it); fence; finalize.
 *                     Prints "ok ..." lines, or "FAIL ..." and exits 2.
 *   pmi2prog abort R  rank R calls PMI2_Abort; the others fence and wait.
 */
#include <slurm/pmi2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...)                      \
    do {                               \
        printf("FAIL " __VA_ARGS__);   \
        printf("\n");                  \
        exit(2);                       \
    } while (0)

int main(int argc, char **argv) {
    int spawned, size, rank, appnum, rc;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if ((rc = PMI2_Init(&spawned, &size, &rank, &appnum)) != PMI2_SUCCESS)
        FAIL("PMI2_Init rc=%d", rc);
    printf("ok init rank=%d size=%d appnum=%d spawned=%d\n", rank, size, appnum, spawned);
    if (argc > 2 && !strcmp(argv[1], "abort")) {
        if (rank == atoi(argv[2]))
            PMI2_Abort(1, "rank gives up");
        PMI2_KVS_Fence();
        PMI2_KVS_Fence(); /* never released: the job ends first */
        return 0;
    }

    char jobid[256];
    if ((rc = PMI2_Job_GetId(jobid, sizeof jobid)) != PMI2_SUCCESS)
        FAIL("PMI2_Job_GetId rc=%d", rc);
    char key[64], val[1024];
    snprintf(key, sizeof key, "card-%d", rank);
    snprintf(val, sizeof val, "addr;%d with spaces", rank); /* ';' and ' ' travel */
    if ((rc = PMI2_KVS_Put(key, val)) != PMI2_SUCCESS)
        FAIL("PMI2_KVS_Put rc=%d", rc);
    if (rank == 0 && (rc = PMI2_Info_PutNodeAttr("node-note", "from-0")) != PMI2_SUCCESS)
        FAIL("PMI2_Info_PutNodeAttr rc=%d", rc);
    if ((rc = PMI2_KVS_Fence()) != PMI2_SUCCESS)
        FAIL("PMI2_KVS_Fence rc=%d", rc);
    for (int r = 0; r < size; r++) {
        int len = 0;
        char want[1024];
        snprintf(key, sizeof key, "card-%d", r);
        snprintf(want, sizeof want, "addr;%d with spaces", r);
        if ((rc = PMI2_KVS_Get(jobid, r, key, val, sizeof val, &len)) != PMI2_SUCCESS || strcmp(val, want))
            FAIL("PMI2_KVS_Get rank=%d key=%s rc=%d value=%s", rank, key, rc, val);
    }
    printf("ok kvs rank=%d cards=%d\n", rank, size);
    int found = 0;
    if ((rc = PMI2_Info_GetJobAttr("PMI_process_mapping", val, sizeof val, &found)) != PMI2_SUCCESS || !found)
        FAIL("PMI2_Info_GetJobAttr rc=%d found=%d", rc, found);
    printf("ok mapping rank=%d %s\n", rank, val);
    if ((rc = PMI2_Info_GetNodeAttr("node-note", val, sizeof val, &found, 1)) != PMI2_SUCCESS || !found)
        FAIL("PMI2_Info_GetNodeAttr rc=%d found=%d", rc, found);
    printf("ok nodeattr rank=%d %s\n", rank, val);
    if ((rc = PMI2_KVS_Fence()) != PMI2_SUCCESS)
        FAIL("second PMI2_KVS_Fence rc=%d", rc);
    if ((rc = PMI2_Finalize()) != PMI2_SUCCESS)
        FAIL("PMI2_Finalize rc=%d", rc);
    return 0;
}
