/* hwlocprog: an MPICH program that also uses hwloc itself, as MPICH's own
 * MPI_Init does, to show where each rank's topology came from. After
 * MPI_Init every rank loads a topology with the filters MPICH uses for I/O
 * objects (only important ones) and prints one line:
 *
 *   rank R madeby M thissystem T pus P pcidevs D osdevs O xmlfile X
 *
 * M is the root object's "ProcessName" info: hwloc records the name of
 * the process that discovered the topology, and an XML import keeps the
 * exporter's, so M is "hwlocprog" when the rank discovered the topology
 * itself and the supervisor's name ("gorun") when it read the one gorun
 * handed it. X is HWLOC_XMLFILE or "-".
 */
#include <hwloc.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0) {
        printf("FAIL rank %d hwloc_topology_init\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0) {
        printf("FAIL rank %d hwloc_topology_load\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *madeby = hwloc_obj_get_info_by_name(hwloc_get_root_obj(t), "ProcessName");
    const char *xml = getenv("HWLOC_XMLFILE");
    printf("rank %d madeby %s thissystem %d pus %d pcidevs %d osdevs %d xmlfile %s\n", rank,
           madeby ? madeby : "?", hwloc_topology_is_thissystem(t),
           hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU), hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PCI_DEVICE),
           hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_OS_DEVICE), xml ? xml : "-");
    fflush(stdout);
    hwloc_topology_destroy(t);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
