/*
 * A stand-in for NVIDIA's Fabric Manager SDK library (libnvfm) for the tests of the ctypes client
 * (dra_driver/nvml/real/fabricmanager.py; tests/fmpartition/test_real_client.py compiles it with `cc`).
 *
 * Written for this project from the SDK's documented interface (docs/passthrough.md "Fabric Manager partitions"):
 * the entry points the client calls, the struct layouts of nv_fm_types.h, the version of each versioned struct
 * computed as NVIDIA's MAKE_FM_PARAM_VERSION does (sizeof | version << 24), and fmReturn_t codes. Behind it an
 * in-memory Fabric Manager in shared NVSwitch mode on an 8-GPU HGX H100 board (the user guide's default partition
 * table: 0 all eight, 1-2 the halves, 3-6 the pairs {1,3} {2,4} {5,7} {6,8}, 7-14 one GPU each).
 *
 * The `fakefm_*` functions are the tests' controls and probes; a real libnvfm has none of them.
 */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

typedef enum {
    FM_ST_SUCCESS = 0,
    FM_ST_BADPARAM = -1,
    FM_ST_GENERIC_ERROR = -2,
    FM_ST_NOT_SUPPORTED = -3,
    FM_ST_UNINITIALIZED = -4,
    FM_ST_TIMEOUT = -5,
    FM_ST_VERSION_MISMATCH = -6,
    FM_ST_IN_USE = -7,
    FM_ST_NOT_CONFIGURED = -8,
    FM_ST_CONNECTION_NOT_VALID = -9,
} fmReturn_t;

#define FM_MAX_STR_LENGTH 256
#define FM_UUID_BUFFER_SIZE 80
#define FM_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define FM_MAX_NUM_GPUS 16
#define FM_MAX_FABRIC_PARTITIONS 64
#define VERSIONED(type, ver) (unsigned int)(sizeof(type) | ((ver) << 24))

typedef void *fmHandle_t;
typedef unsigned int fmFabricPartitionId_t;

enum addrType { ADDR_UNKNOWN = 0, ADDR_INET = 1, ADDR_UNIX = 2, ADDR_VSOCK = 3 };

typedef struct {
    unsigned int version;
    char addressInfo[FM_MAX_STR_LENGTH];
    unsigned int timeoutMs;
    unsigned int addressIsUnixSocket;
    enum addrType addressType;
} connectParams;

typedef struct {
    unsigned int physicalId;
    char uuid[FM_UUID_BUFFER_SIZE];
    char pciBusId[FM_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned int numNvLinksAvailable;
    unsigned int maxNumNvLinks;
    unsigned int nvlinkLineRateMBps;
} gpuInfo;

typedef struct {
    fmFabricPartitionId_t partitionId;
    unsigned int isActive;
    unsigned int numGpus;
    gpuInfo gpus[FM_MAX_NUM_GPUS];
} partitionInfo;

typedef struct {
    unsigned int version;
    unsigned int numPartitions;
    unsigned int maxNumPartitions;
    partitionInfo partitions[FM_MAX_FABRIC_PARTITIONS];
} partitionList;

typedef struct {
    unsigned int version;
    unsigned int numPartitions;
    fmFabricPartitionId_t partitionIds[FM_MAX_FABRIC_PARTITIONS];
} activatedList;

#define CONNECT_VERSION VERSIONED(connectParams, 2)
#define LIST_VERSION VERSIONED(partitionList, 1)
#define ACTIVATED_VERSION VERSIONED(activatedList, 1)

#define NUM_PARTITIONS 15
static const unsigned int members[NUM_PARTITIONS] = {
    /* bit n-1: GPU physical id n */
    0xff, 0x0f, 0xf0, 0x05, 0x0a, 0x50, 0xa0, 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80,
};

struct handle {
    unsigned int magic;
    unsigned int generation;
};
#define HANDLE_MAGIC 0x6e76666dU

static int initialised;
static int up = 1;
static int hostile;
static int blank_ids;
static unsigned int generation = 1;
static int active[NUM_PARTITIONS];
static int listen_type = ADDR_UNIX;
static char listen_address[FM_MAX_STR_LENGTH] = "/run/nvidia-fabricmanager/socket";
static char last_address[FM_MAX_STR_LENGTH];
static long counters[16];
enum { C_INITS, C_SHUTDOWNS, C_CONNECTS, C_DISCONNECTS, C_OPEN, C_LAST_TYPE, C_LAST_UNIX_FLAG, C_LAST_TIMEOUT,
       C_LIST_CALLS, C_SET_CALLS, C_SET_COUNT, C_SET_FIRST };

/* ---- the tests' controls and probes ---- */
void fakefm_reset(void) {
    initialised = 0;
    up = 1;
    hostile = 0;
    blank_ids = 0;
    generation++;
    memset(active, 0, sizeof(active));
    memset(counters, 0, sizeof(counters));
    listen_type = ADDR_UNIX;
    strcpy(listen_address, "/run/nvidia-fabricmanager/socket");
}
void fakefm_set_up(int value) { up = value; }
void fakefm_set_hostile(int mode) { hostile = mode; }
void fakefm_set_blank_ids(int value) { blank_ids = value; }
void fakefm_listen(int type, const char *address) {
    listen_type = type;
    snprintf(listen_address, sizeof(listen_address), "%s", address);
}
/* FM restarted without --restart (shared NVSwitch mode): a new instance, no partition active, old handles dead. */
void fakefm_restart(void) {
    generation++;
    memset(active, 0, sizeof(active));
}
long fakefm_counter(int which) { return which >= 0 && which < 16 ? counters[which] : -1; }
int fakefm_active(int id) { return id >= 0 && id < NUM_PARTITIONS ? active[id] : -1; }
int fakefm_initialised(void) { return initialised; }
const char *fakefm_last_address(void) { return last_address; }
unsigned int fakefm_struct_version(int which) {
    return which == 0 ? CONNECT_VERSION : which == 1 ? LIST_VERSION : ACTIVATED_VERSION;
}

/* ---- the SDK ---- */
fmReturn_t fmLibInit(void) {
    if (initialised) return FM_ST_IN_USE;
    initialised = 1;
    counters[C_INITS]++;
    return FM_ST_SUCCESS;
}

fmReturn_t fmLibShutdown(void) {
    if (!initialised) return FM_ST_UNINITIALIZED;
    initialised = 0;
    counters[C_SHUTDOWNS]++;
    return FM_ST_SUCCESS;
}

fmReturn_t fmConnect(connectParams *params, fmHandle_t *out) {
    if (!initialised) return FM_ST_UNINITIALIZED;
    if (params == NULL || out == NULL) return FM_ST_BADPARAM;
    if (params->version != CONNECT_VERSION) return FM_ST_VERSION_MISMATCH;
    if (memchr(params->addressInfo, 0, FM_MAX_STR_LENGTH) == NULL) return FM_ST_BADPARAM;
    memcpy(last_address, params->addressInfo, FM_MAX_STR_LENGTH);
    counters[C_LAST_TYPE] = params->addressType;
    counters[C_LAST_UNIX_FLAG] = params->addressIsUnixSocket;
    counters[C_LAST_TIMEOUT] = params->timeoutMs;
    if (!up || (int)params->addressType != listen_type || strcmp(params->addressInfo, listen_address) != 0)
        return FM_ST_CONNECTION_NOT_VALID;
    struct handle *h = malloc(sizeof(*h));
    if (h == NULL) return FM_ST_GENERIC_ERROR;
    h->magic = HANDLE_MAGIC;
    h->generation = generation;
    *out = h;
    counters[C_CONNECTS]++;
    counters[C_OPEN]++;
    return FM_ST_SUCCESS;
}

fmReturn_t fmDisconnect(fmHandle_t handle) {
    struct handle *h = handle;
    if (!initialised) return FM_ST_UNINITIALIZED;
    if (h == NULL || h->magic != HANDLE_MAGIC) return FM_ST_BADPARAM;
    h->magic = 0;
    free(h);
    counters[C_DISCONNECTS]++;
    counters[C_OPEN]--;
    return FM_ST_SUCCESS;
}

static fmReturn_t check_handle(fmHandle_t handle) {
    const struct handle *h = handle;
    if (!initialised) return FM_ST_UNINITIALIZED;
    if (h == NULL || h->magic != HANDLE_MAGIC) return FM_ST_BADPARAM;
    if (h->generation != generation || !up) return FM_ST_CONNECTION_NOT_VALID;
    return FM_ST_SUCCESS;
}

static void fill_gpu(gpuInfo *gpu, unsigned int physical) {
    memset(gpu, 0, sizeof(*gpu));
    gpu->physicalId = physical;
    if (!blank_ids) {  /* H100 and later boards leave both empty */
        snprintf(gpu->uuid, sizeof(gpu->uuid), "GPU-fa4e0000-0000-0000-0000-00000000000%u", physical);
        snprintf(gpu->pciBusId, sizeof(gpu->pciBusId), "00000000:%02X:00.0", 0x18 + physical);
    }
    gpu->numNvLinksAvailable = 18;
    gpu->maxNumNvLinks = 18;
    gpu->nvlinkLineRateMBps = 26562;
}

fmReturn_t fmGetSupportedFabricPartitions(fmHandle_t handle, partitionList *list) {
    fmReturn_t rc = check_handle(handle);
    if (rc != FM_ST_SUCCESS) return rc;
    if (list == NULL) return FM_ST_BADPARAM;
    if (list->version != LIST_VERSION) return FM_ST_VERSION_MISMATCH;
    counters[C_LIST_CALLS]++;
    if (hostile == 6) return (fmReturn_t)-31;
    list->numPartitions = NUM_PARTITIONS;
    list->maxNumPartitions = FM_MAX_FABRIC_PARTITIONS;
    for (unsigned int p = 0; p < NUM_PARTITIONS; p++) {
        partitionInfo *info = &list->partitions[p];
        info->partitionId = p;
        info->isActive = (unsigned int)active[p];
        info->numGpus = 0;
        for (unsigned int g = 0; g < 8; g++)
            if (members[p] & (1U << g)) fill_gpu(&info->gpus[info->numGpus++], g + 1);
    }
    switch (hostile) {
    case 1: list->numPartitions = FM_MAX_FABRIC_PARTITIONS + 1; break;
    case 2: list->partitions[0].numGpus = FM_MAX_NUM_GPUS + 1; break;
    case 3: memset(list->partitions[2].gpus[1].uuid, 'A', FM_UUID_BUFFER_SIZE); break;
    case 4: list->partitions[1].partitionId = 0; break;
    case 5: list->partitions[3].isActive = 2; break;
    default: break;
    }
    return FM_ST_SUCCESS;
}

fmReturn_t fmActivateFabricPartition(fmHandle_t handle, fmFabricPartitionId_t id) {
    fmReturn_t rc = check_handle(handle);
    if (rc != FM_ST_SUCCESS) return rc;
    if (id >= NUM_PARTITIONS) return FM_ST_BADPARAM;
    if (active[id]) return FM_ST_IN_USE;
    for (unsigned int p = 0; p < NUM_PARTITIONS; p++)
        if (active[p] && (members[p] & members[id])) return FM_ST_IN_USE;
    active[id] = 1;
    return FM_ST_SUCCESS;
}

fmReturn_t fmDeactivateFabricPartition(fmHandle_t handle, fmFabricPartitionId_t id) {
    fmReturn_t rc = check_handle(handle);
    if (rc != FM_ST_SUCCESS) return rc;
    if (id >= NUM_PARTITIONS) return FM_ST_BADPARAM;
    if (!active[id]) return FM_ST_UNINITIALIZED;
    active[id] = 0;
    return FM_ST_SUCCESS;
}

fmReturn_t fmSetActivatedFabricPartitions(fmHandle_t handle, activatedList *list) {
    fmReturn_t rc = check_handle(handle);
    if (rc != FM_ST_SUCCESS) return rc;
    if (list == NULL || list->numPartitions > FM_MAX_FABRIC_PARTITIONS) return FM_ST_BADPARAM;
    if (list->version != ACTIVATED_VERSION) return FM_ST_VERSION_MISMATCH;
    unsigned int seen = 0;
    for (unsigned int i = 0; i < list->numPartitions; i++) {
        fmFabricPartitionId_t id = list->partitionIds[i];
        if (id >= NUM_PARTITIONS || (seen & members[id])) return FM_ST_BADPARAM;
        seen |= members[id];
    }
    memset(active, 0, sizeof(active));
    for (unsigned int i = 0; i < list->numPartitions; i++) active[list->partitionIds[i]] = 1;
    counters[C_SET_CALLS]++;
    counters[C_SET_COUNT] = list->numPartitions;
    counters[C_SET_FIRST] = list->numPartitions > 0 ? (long)list->partitionIds[0] : -1;
    return FM_ST_SUCCESS;
}
