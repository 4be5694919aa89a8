/* A 64 B ping-pong between two MPI ranks three ways, to tell how much of the mpi
 * backend's round trip is the receive style it uses and how much is its own layers:
 *   blocking       MPI_Send / MPI_Recv (bench mpi's raw baseline)
 *   improbe+mrecv  MPI_Isend + MPI_Test, and a receiver polling MPI_Improbe then
 *                  MPI_Mrecv into a fresh buffer (what the backend does)
 *   preposted      MPI_Isend + MPI_Test, and a receive posted ahead, polled with
 *                  MPI_Test, its bytes copied out and the receive posted again
 * Under MPI_THREAD_MULTIPLE, on a duplicate of MPI_COMM_WORLD, as the backend runs.
 *
 *   mpicc -O2 -o /tmp/mpi-pingpong scripts/mpi-pingpong.c
 *   mpirun -np 2 /tmp/mpi-pingpong      (as root: --allow-run-as-root)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 20000
#define LEN 64
#define POSTED 20000

static void send_and_complete(const char *buf, int other, MPI_Comm comm) {
    MPI_Request request;
    int done = 0;
    MPI_Isend(buf, LEN, MPI_BYTE, other, 1, comm, &request);
    while (!done) MPI_Test(&request, &done, MPI_STATUS_IGNORE);
}

static void receive_by_probe(MPI_Comm comm) {
    int found = 0, count;
    MPI_Message message;
    MPI_Status status;
    while (!found) MPI_Improbe(MPI_ANY_SOURCE, 1, comm, &found, &message, &status);
    MPI_Get_count(&status, MPI_BYTE, &count);
    char *buffer = malloc(count);
    MPI_Mrecv(buffer, count, MPI_BYTE, &message, MPI_STATUS_IGNORE);
    free(buffer);
}

static void receive_posted(char *posted, MPI_Request *request, MPI_Comm comm) {
    int done = 0, count;
    MPI_Status status;
    while (!done) MPI_Test(request, &done, &status);
    MPI_Get_count(&status, MPI_BYTE, &count);
    char *buffer = malloc(count);
    memcpy(buffer, posted, count);
    free(buffer);
    MPI_Irecv(posted, POSTED, MPI_BYTE, MPI_ANY_SOURCE, 1, comm, request);
}

int main(int argc, char **argv) {
    int provided, rank;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    int other = 1 - rank;
    static char buf[LEN], posted[POSTED];
    for (int rep = 0; rep < 3; rep++) {
        MPI_Barrier(comm);
        double started = MPI_Wtime();
        for (int i = 0; i < ROUNDS; i++) {
            if (rank == 0) {
                MPI_Send(buf, LEN, MPI_BYTE, other, 1, comm);
                MPI_Recv(buf, LEN, MPI_BYTE, other, 1, comm, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(buf, LEN, MPI_BYTE, other, 1, comm, MPI_STATUS_IGNORE);
                MPI_Send(buf, LEN, MPI_BYTE, other, 1, comm);
            }
        }
        double blocking = (MPI_Wtime() - started) / ROUNDS * 1e6;

        MPI_Barrier(comm);
        started = MPI_Wtime();
        for (int i = 0; i < ROUNDS; i++) {
            if (rank == 0) {
                send_and_complete(buf, other, comm);
                receive_by_probe(comm);
            } else {
                receive_by_probe(comm);
                send_and_complete(buf, other, comm);
            }
        }
        double probed = (MPI_Wtime() - started) / ROUNDS * 1e6;

        MPI_Request request;
        MPI_Irecv(posted, POSTED, MPI_BYTE, MPI_ANY_SOURCE, 1, comm, &request);
        MPI_Barrier(comm);
        started = MPI_Wtime();
        for (int i = 0; i < ROUNDS; i++) {
            if (rank == 0) {
                send_and_complete(buf, other, comm);
                receive_posted(posted, &request, comm);
            } else {
                receive_posted(posted, &request, comm);
                send_and_complete(buf, other, comm);
            }
        }
        double preposted = (MPI_Wtime() - started) / ROUNDS * 1e6;
        MPI_Cancel(&request);
        MPI_Wait(&request, MPI_STATUS_IGNORE);
        if (rank == 0)
            printf("64 B round trip (us): blocking %.2f  improbe+mrecv %.2f  preposted %.2f\n",
                   blocking, probed, preposted);
    }
    MPI_Comm_free(&comm);
    MPI_Finalize();
    return 0;
}
