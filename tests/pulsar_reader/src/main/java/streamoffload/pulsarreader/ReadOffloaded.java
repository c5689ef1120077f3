package streamoffload.pulsarreader;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.bookkeeper.client.api.LedgerEntries;
import org.apache.bookkeeper.client.api.LedgerEntry;
import org.apache.bookkeeper.client.api.ReadHandle;
import org.apache.bookkeeper.common.util.OrderedScheduler;
import org.apache.bookkeeper.mledger.LedgerOffloaderStats;
import org.apache.bookkeeper.mledger.LedgerOffloaderStatsDisable;
import org.apache.bookkeeper.mledger.offload.jcloud.JCloudLedgerOffloaderFactory;
import org.apache.bookkeeper.mledger.offload.jcloud.impl.BlobStoreBackedReadHandleImpl;
import org.apache.bookkeeper.mledger.offload.jcloud.impl.BlobStoreBackedReadHandleImplV2;
import org.apache.bookkeeper.mledger.offload.jcloud.impl.BlobStoreManagedLedgerOffloader;
import org.apache.bookkeeper.mledger.offload.jcloud.impl.DataBlockUtils;
import org.apache.bookkeeper.mledger.offload.jcloud.impl.OffsetsCache;
import org.apache.bookkeeper.mledger.offload.jcloud.provider.TieredStorageConfiguration;
import org.apache.bookkeeper.mledger.proto.MLDataFormats;
import org.apache.pulsar.common.policies.data.OffloadPoliciesImpl;
import org.jclouds.blobstore.BlobStore;

/**
 * Reads offloaded ledgers with Apache Pulsar's own jcloud offloader and prints every entry, for the Python
 * tests (tests/interop/test_pulsar_reader.py) to compare byte for byte with what streamoffload wrote.
 *
 * <p>Input (stdin, one JSON document):
 * <pre>
 * {"offloadPolicies": {broker.conf names: managedLedgerOffloadDriver, s3ManagedLedgerOffloadBucket, ...},
 *  "offloadDriverMetadata": {what a broker records in OffloadContext.driverMetadata, plus ManagedLedgerName},
 *  "reads": [{"ledgerId": 3, "uuid": "...", "keyPrefix": "", "firstEntry": 0},             (v1, PIP-17)
 *            {"ledgerId": 3, "segments": ["uuid", ...], "keyPrefix": "", "firstEntry": 0}]} (v2, PIP-76)
 * </pre>
 * Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), as on a broker.
 *
 * <p>A read with an empty keyPrefix goes through {@code LedgerOffloader.readOffloaded}, exactly as a broker
 * opens an offloaded ledger: Pulsar's keys are at the bucket root and no configuration puts them under a
 * prefix. With a keyPrefix it calls the read handle's {@code open} itself, with the keys readOffloaded would
 * name under that prefix, the same version check, blob store, read buffer and executor.
 *
 * <p>Output (stdout, one JSON object a line, each with "read": the read's index in the request): per read
 * {"kind": "ledger", ledgerId, lastAddConfirmed, length,
 * closed}, then {"kind": "entry", ledgerId, entryId, payload (base64)} per entry from firstEntry to the
 * last-add-confirmed, or {"kind": "error", ledgerId, error} when Pulsar's reader refuses it. Exit status 1 if
 * any read failed, 2 for a request it cannot use.
 */
public final class ReadOffloaded {
    private static final int BATCH = 1000;
    private static final long TIMEOUT_SECONDS = 120;
    private static final String MANAGED_LEDGER_NAME = "ManagedLedgerName";

    private ReadOffloaded() {
    }

    public static void main(String[] args) throws Exception {
        // stdout is for the entries alone: every logger that writes to System.out (log4j's console appender,
        // configured by the log4j2.xml in bookkeeper-server's jar) writes to stderr instead.
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
        System.setOut(System.err);
        ObjectMapper mapper = new ObjectMapper();
        JsonNode request;
        try {
            request = mapper.readTree(System.in);
        } catch (Exception e) {
            System.err.println("pulsar-reader: stdin is not a JSON request: " + e.getMessage());
            System.exit(2);
            return;
        }
        if (request == null || !request.path("reads").isArray() || !request.path("offloadPolicies").isObject()) {
            System.err.println("pulsar-reader: the request needs \"offloadPolicies\" (object) and \"reads\" (array)");
            System.exit(2);
            return;
        }
        Properties properties = new Properties();
        request.get("offloadPolicies").fields()
                .forEachRemaining(f -> properties.put(f.getKey(), f.getValue().asText()));
        Map<String, String> driverMetadata = new HashMap<>();
        request.path("offloadDriverMetadata").fields().forEachRemaining(f -> driverMetadata.put(f.getKey(),
                f.getValue().asText()));

        OffloadPoliciesImpl policies = OffloadPoliciesImpl.create(properties);
        OrderedScheduler scheduler = OrderedScheduler.newSchedulerBuilder().numThreads(1).name("offloader").build();
        LedgerOffloaderStats stats = LedgerOffloaderStatsDisable.INSTANCE;
        JCloudLedgerOffloaderFactory factory = new JCloudLedgerOffloaderFactory();
        // The broker's path: OffloadPoliciesImpl from its configuration, the factory, the offloader.
        BlobStoreManagedLedgerOffloader offloader = factory.create(policies, Map.of(), scheduler, stats);
        // The prefixed reads' own handles, built from the same configuration as the offloader's.
        TieredStorageConfiguration config = TieredStorageConfiguration.create(policies.toProperties());
        BlobStore blobStore = null;
        OffsetsCache offsets = new OffsetsCache();
        boolean failed = false;
        try {
            int index = 0;
            for (JsonNode read : request.get("reads")) {
                int readIndex = index++;
                long ledgerId = read.path("ledgerId").asLong(-1);
                String prefix = read.path("keyPrefix").asText("");
                ReadHandle handle = null;
                try {
                    if (prefix.isEmpty()) {
                        handle = viaOffloader(offloader, read, ledgerId, driverMetadata);
                    } else {
                        if (blobStore == null) {
                            blobStore = config.getBlobStore();
                        }
                        handle = viaOpen(scheduler, blobStore, config, offsets, read, ledgerId, prefix,
                                driverMetadata);
                    }
                    print(out, mapper, handle, readIndex, ledgerId, read.path("firstEntry").asLong(0));
                } catch (Exception e) {
                    failed = true;
                    ObjectNode line = mapper.createObjectNode();
                    line.put("read", readIndex).put("kind", "error").put("ledgerId", ledgerId)
                            .put("error", describe(e));
                    out.println(mapper.writeValueAsString(line));
                } finally {
                    if (handle != null) {
                        handle.closeAsync().get(TIMEOUT_SECONDS, TimeUnit.SECONDS);
                    }
                }
                out.flush();
            }
        } finally {
            out.flush();
            offloader.close();
            if (blobStore != null) {
                blobStore.getContext().close();
            }
            offsets.close();
            factory.close();
            scheduler.shutdownNow();
        }
        System.exit(failed ? 1 : 0);
    }

    private static boolean isV2(JsonNode read) {
        return read.has("segments");
    }

    private static List<UUID> segments(JsonNode read) {
        List<UUID> uuids = new ArrayList<>();
        read.get("segments").forEach(s -> uuids.add(UUID.fromString(s.asText())));
        return uuids;
    }

    private static ReadHandle viaOffloader(BlobStoreManagedLedgerOffloader offloader, JsonNode read, long ledgerId,
                                           Map<String, String> driverMetadata) throws Exception {
        if (!isV2(read)) {
            return offloader.readOffloaded(ledgerId, UUID.fromString(read.path("uuid").asText()), driverMetadata)
                    .get(TIMEOUT_SECONDS, TimeUnit.SECONDS);
        }
        // PIP-76's OffloadContext: one OffloadSegment per data object that holds entries of the ledger.
        MLDataFormats.OffloadContext.Builder context = MLDataFormats.OffloadContext.newBuilder().setComplete(true);
        for (UUID uuid : segments(read)) {
            context.addOffloadSegment(MLDataFormats.OffloadSegment.newBuilder()
                    .setUidMsb(uuid.getMostSignificantBits())
                    .setUidLsb(uuid.getLeastSignificantBits())
                    .setComplete(true));
        }
        return offloader.readOffloaded(ledgerId, context.build(), driverMetadata)
                .get(TIMEOUT_SECONDS, TimeUnit.SECONDS);
    }

    private static ReadHandle viaOpen(OrderedScheduler scheduler, BlobStore blobStore,
                                      TieredStorageConfiguration config, OffsetsCache offsets, JsonNode read,
                                      long ledgerId, String prefix, Map<String, String> driverMetadata)
            throws Exception {
        String bucket = driverMetadata.getOrDefault(TieredStorageConfiguration.METADATA_FIELD_BUCKET,
                config.getBucket());
        String managedLedgerName = driverMetadata.get(MANAGED_LEDGER_NAME);
        if (!isV2(read)) {
            UUID uuid = UUID.fromString(read.path("uuid").asText());
            return BlobStoreBackedReadHandleImpl.open(scheduler.chooseThread(ledgerId), blobStore, bucket,
                    prefix + DataBlockUtils.dataBlockOffloadKey(ledgerId, uuid),
                    prefix + DataBlockUtils.indexBlockOffloadKey(ledgerId, uuid),
                    DataBlockUtils.VERSION_CHECK, ledgerId, config.getReadBufferSizeInBytes(),
                    LedgerOffloaderStatsDisable.INSTANCE, managedLedgerName, offsets);
        }
        List<String> keys = new ArrayList<>();
        List<String> indexKeys = new ArrayList<>();
        for (UUID uuid : segments(read)) {
            keys.add(prefix + uuid);
            indexKeys.add(prefix + DataBlockUtils.indexBlockOffloadKey(uuid));
        }
        return BlobStoreBackedReadHandleImplV2.open(scheduler.chooseThread(ledgerId), blobStore, bucket, keys,
                indexKeys, DataBlockUtils.VERSION_CHECK, ledgerId, config.getReadBufferSizeInBytes(),
                LedgerOffloaderStatsDisable.INSTANCE, managedLedgerName);
    }

    private static void print(PrintStream out, ObjectMapper mapper, ReadHandle handle, int readIndex, long ledgerId,
                              long first)
            throws Exception {
        long last = handle.getLastAddConfirmed();
        ObjectNode head = mapper.createObjectNode();
        head.put("read", readIndex).put("kind", "ledger").put("ledgerId", ledgerId).put("lastAddConfirmed", last)
                .put("length", handle.getLength()).put("closed", handle.isClosed());
        out.println(mapper.writeValueAsString(head));
        Base64.Encoder base64 = Base64.getEncoder();
        for (long from = first; from <= last; from += BATCH) {
            long to = Math.min(last, from + BATCH - 1);
            try (LedgerEntries entries = handle.readAsync(from, to).get(TIMEOUT_SECONDS, TimeUnit.SECONDS)) {
                for (LedgerEntry entry : entries) {
                    ObjectNode line = mapper.createObjectNode();
                    line.put("read", readIndex).put("kind", "entry").put("ledgerId", entry.getLedgerId())
                            .put("entryId", entry.getEntryId())
                            .put("payload", base64.encodeToString(entry.getEntryBytes()));
                    out.println(mapper.writeValueAsString(line));
                }
            }
        }
    }

    /** The cause chain, one "Class: message" per link: what Pulsar's reader said, without a stack trace. */
    private static String describe(Throwable t) {
        StringBuilder sb = new StringBuilder();
        for (Throwable c = t; c != null; c = c.getCause() == c ? null : c.getCause()) {
            if (c instanceof ExecutionException && c.getCause() != null) {
                continue;
            }
            if (sb.length() > 0) {
                sb.append(" <- ");
            }
            sb.append(c.getClass().getName());
            if (c.getMessage() != null) {
                sb.append(": ").append(c.getMessage());
            }
        }
        return sb.toString();
    }
}
