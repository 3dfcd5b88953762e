/*
 * AmqpClient: a second AMQP 1.0 client for lakegate's tests, on the Qpid
 * protonj2 client (org.apache.qpid:protonj2-client), so that what the edge
 * sends and accepts is decoded and encoded by something that is not
 * python-qpid-proton (issue 39). One file, run by Java 17's source launcher,
 * no build step (the launcher compiles it in memory first: about 1 s of a
 * run's 1-2 s on 2 cores):
 *
 *   java -cp '<repo>/.jvm/lib/protonj2/*' AmqpClient.java receive <url> <address> <count> <timeout_s>
 *   java -cp '<repo>/.jvm/lib/protonj2/*' AmqpClient.java send <url> <address> <json-message|-> [timeout_s]
 *
 * <url>: amqp://[user:password@]host[:port] (no user: SASL ANONYMOUS).
 *
 * receive: attaches a receiver to <address>, prints READY once the peer has
 *   attached it (publish after that), then one JSON line per message, and
 *   accepts each, until <count> messages (exit 0) or <timeout_s> seconds
 *   after READY (exit 1).
 * send: sends one message built from the JSON spec (the argument, or stdin
 *   for "-") at least once, waits up to [timeout_s] (default 15) for the
 *   peer's outcome and prints it as one JSON line:
 *   {"outcome":"accepted"} | {"outcome":"rejected","condition":..,"description":..}
 *   | {"outcome":"released"} | {"outcome":"modified","delivery_failed":..,"undeliverable_here":..}
 *
 * Exit codes: 0 done (receive: <count> messages; send: accepted)
 *             1 timeout (receive: fewer messages; send: no outcome), reason on stderr
 *             2 usage: bad arguments or JSON, reason on stderr
 *             3 the connection or link failed or was refused, reason on stderr
 *             4 send: an outcome other than accepted (printed, as above)
 *
 * The message JSON, printed by receive and read by send (send leaves out
 * what is absent or null, and refuses a field it does not know, exit 2):
 *
 *   {"header": {"durable": true, "priority": 4, "ttl": 1000, "first_acquirer": false,
 *               "delivery_count": 0},
 *    "properties": {"message_id": <typed>, "user_id": "<base64>", "to": "a/b", "subject": "s",
 *                   "reply_to": "r", "correlation_id": <typed>, "content_type": "text/plain",
 *                   "content_encoding": "e", "absolute_expiry_time": <ms>, "creation_time": <ms>,
 *                   "group_id": "g"},
 *    "message_annotations": {"x-qos": <typed>, ...},
 *    "application_properties": {"k": <typed>, ...},
 *    "body": [{"kind": "data", "base64": "..."}]}
 *
 * <typed> is {"type": T, "value": V}: the AMQP type name and the value as
 * JSON: null, boolean, ubyte, ushort, uint, ulong, byte, short, int, long
 * (numbers), float, double, char, string, symbol (text), timestamp (ms
 * since the epoch), uuid (8-4-4-4-12), binary (base64), list (of <typed>),
 * map (a list of [<typed key>, <typed value>] pairs). The body is a list of
 * sections: {"kind": "data", "base64": ...}, {"kind": "amqp-value", "value":
 * <typed>} or {"kind": "amqp-sequence", "value": [<typed>, ...]}; send also
 * takes one section instead of a list. Printed by receive: a header field
 * the message does not carry is null (its AMQP default applies), a missing
 * section is null, and so is a missing property. The type names come from
 * the Java classes protonj2 decodes to, which tell every AMQP type apart
 * but one: protonj2 decodes a timestamp as a Long, so a received timestamp
 * prints as "long" (send encodes "timestamp" as one).
 *
 * Why JSON and a small reader and writer of it here: protonj2 brings no
 * JSON library, and the same shape both ways lets a test compare what it
 * sent with what arrived, types included; key=value arguments would need a
 * grammar of their own for typed values, lists and the body.
 */

import java.math.BigDecimal;
import java.math.BigInteger;
import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Date;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

import org.apache.qpid.protonj2.client.AdvancedMessage;
import org.apache.qpid.protonj2.client.Client;
import org.apache.qpid.protonj2.client.Connection;
import org.apache.qpid.protonj2.client.ConnectionOptions;
import org.apache.qpid.protonj2.client.Delivery;
import org.apache.qpid.protonj2.client.DeliveryState;
import org.apache.qpid.protonj2.client.Message;
import org.apache.qpid.protonj2.client.Receiver;
import org.apache.qpid.protonj2.client.ReceiverOptions;
import org.apache.qpid.protonj2.client.Sender;
import org.apache.qpid.protonj2.client.Tracker;
import org.apache.qpid.protonj2.client.exceptions.ClientException;
import org.apache.qpid.protonj2.types.Binary;
import org.apache.qpid.protonj2.types.Symbol;
import org.apache.qpid.protonj2.types.UnsignedByte;
import org.apache.qpid.protonj2.types.UnsignedInteger;
import org.apache.qpid.protonj2.types.UnsignedLong;
import org.apache.qpid.protonj2.types.UnsignedShort;
import org.apache.qpid.protonj2.types.messaging.AmqpSequence;
import org.apache.qpid.protonj2.types.messaging.AmqpValue;
import org.apache.qpid.protonj2.types.messaging.ApplicationProperties;
import org.apache.qpid.protonj2.types.messaging.Data;
import org.apache.qpid.protonj2.types.messaging.Header;
import org.apache.qpid.protonj2.types.messaging.MessageAnnotations;
import org.apache.qpid.protonj2.types.messaging.Modified;
import org.apache.qpid.protonj2.types.messaging.Properties;
import org.apache.qpid.protonj2.types.messaging.Rejected;
import org.apache.qpid.protonj2.types.messaging.Section;

public class AmqpClient {
    static final int OK = 0, TIMEOUT = 1, USAGE = 2, FAILED = 3, NOT_ACCEPTED = 4;

    public static void main(String[] args) {
        // slf4j-api comes without a logging provider: no "no providers" warning on stderr
        System.setProperty("slf4j.internal.verbosity", "ERROR");
        int code;
        try {
            code = run(args);
        } catch (Usage e) {
            System.err.println("AmqpClient: " + e.getMessage());
            System.err.println("usage: AmqpClient receive <url> <address> <count> <timeout_s>\n"
                    + "       AmqpClient send <url> <address> <json-message|-> [timeout_s]");
            code = USAGE;
        } catch (ClientException | ExecutionException e) {
            Throwable t = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
            System.err.println("AmqpClient: " + t.getClass().getSimpleName() + ": " + t.getMessage());
            code = FAILED;
        } catch (Exception e) {
            System.err.println("AmqpClient: " + e);
            code = FAILED;
        }
        System.out.flush();
        System.exit(code);
    }

    static int run(String[] args) throws Exception {
        if (args.length < 1) throw new Usage("no command");
        if (args[0].equals("receive") && args.length == 5) {
            return receive(args[1], args[2], intArg(args[3], "count"), seconds(args[4]));
        }
        if (args[0].equals("send") && (args.length == 4 || args.length == 5)) {
            String spec = args[3].equals("-") ? new String(System.in.readAllBytes(), StandardCharsets.UTF_8) : args[3];
            Object parsed;
            try {
                parsed = new JsonReader(spec).document();
            } catch (IllegalArgumentException e) {
                throw new Usage("the message is not JSON: " + e.getMessage());
            }
            AdvancedMessage<Object> message = Spec.message(parsed);
            return send(args[1], args[2], message, args.length == 5 ? seconds(args[4]) : 15_000);
        }
        throw new Usage("unknown command or wrong number of arguments");
    }

    // ------------------------------------------------------------ the two commands

    static int receive(String url, String address, int count, long timeoutMs) throws Exception {
        try (Client client = Client.create(); Connection conn = connect(client, url)) {
            ReceiverOptions options = new ReceiverOptions().autoAccept(false).creditWindow(Math.max(count, 1));
            Receiver receiver = conn.openReceiver(address, options);
            get(receiver.openFuture(), timeoutMs, "the receiver's attach");
            System.out.println("READY");
            System.out.flush();
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
            int got = 0;
            while (got < count) {
                long left = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
                Delivery delivery = left > 0 ? receiver.receive(left, TimeUnit.MILLISECONDS) : null;
                if (delivery == null) {
                    System.err.printf("AmqpClient: timeout: %d of %d messages on %s within %d ms%n",
                            got, count, address, timeoutMs);
                    return TIMEOUT;
                }
                System.out.println(Json.write(Spec.describe(delivery.message())));
                System.out.flush();
                delivery.accept();
                got++;
            }
            receiver.close();
            return OK;
        }
    }

    static int send(String url, String address, AdvancedMessage<Object> message, long timeoutMs) throws Exception {
        try (Client client = Client.create(); Connection conn = connect(client, url)) {
            Sender sender = conn.openSender(address);
            get(sender.openFuture(), timeoutMs, "the sender's attach");
            Tracker tracker = sender.send(message);
            try {
                tracker.awaitSettlement(timeoutMs, TimeUnit.MILLISECONDS);
            } catch (ClientException e) { // timed out, or the link ended: the outcome may have come anyway
                if (tracker.remoteState() == null) {
                    System.err.println("AmqpClient: no outcome within " + timeoutMs + " ms: " + e.getMessage());
                    return TIMEOUT;
                }
            }
            DeliveryState state = tracker.remoteState();
            System.out.println(Json.write(outcome(state)));
            System.out.flush();
            sender.close();
            return state != null && state.isAccepted() ? OK : NOT_ACCEPTED;
        }
    }

    static Connection connect(Client client, String url) throws Exception {
        URI uri = new URI(url);
        if (!"amqp".equals(uri.getScheme()) || uri.getHost() == null) {
            throw new Usage("not an amqp://host[:port] URL: " + url);
        }
        ConnectionOptions options = new ConnectionOptions().openTimeout(15, TimeUnit.SECONDS);
        String info = uri.getRawUserInfo();
        if (info != null) {
            int colon = info.indexOf(':');
            options.user(decode(colon < 0 ? info : info.substring(0, colon)));
            if (colon >= 0) options.password(decode(info.substring(colon + 1)));
        }
        Connection conn = client.connect(uri.getHost(), uri.getPort() < 0 ? 5672 : uri.getPort(), options);
        get(conn.openFuture(), 15_000, "the connection's open");
        return conn;
    }

    /** The peer's outcome as JSON. The client API names only its type; the rejected
     * condition and the modified flags are in the proton type behind it, which
     * ClientDeliveryState keeps in a package-private method (hence reflection). */
    static Map<String, Object> outcome(DeliveryState state) throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        if (state == null) {
            out.put("outcome", null);
            return out;
        }
        out.put("outcome", state.getType().name().toLowerCase());
        Object proton = null;
        try {
            var m = state.getClass().getDeclaredMethod("getProtonDeliveryState");
            m.setAccessible(true);
            proton = m.invoke(state);
        } catch (ReflectiveOperationException e) {
            out.put("detail_unavailable", e.toString());
        }
        if (proton instanceof Rejected r && r.getError() != null) {
            out.put("condition", r.getError().getCondition() == null ? null : r.getError().getCondition().toString());
            out.put("description", r.getError().getDescription());
        } else if (proton instanceof Modified m) {
            out.put("delivery_failed", m.isDeliveryFailed());
            out.put("undeliverable_here", m.isUndeliverableHere());
        }
        return out;
    }

    static <T> T get(java.util.concurrent.Future<T> future, long timeoutMs, String what) throws Exception {
        try {
            return future.get(timeoutMs, TimeUnit.MILLISECONDS);
        } catch (TimeoutException e) {
            throw new ClientException("no answer to " + what + " within " + timeoutMs + " ms");
        }
    }

    static int intArg(String s, String what) {
        try {
            return Integer.parseInt(s);
        } catch (NumberFormatException e) {
            throw new Usage(what + " is not a whole number: " + s);
        }
    }

    static long seconds(String s) {
        try {
            return Math.round(Double.parseDouble(s) * 1000.0);
        } catch (NumberFormatException e) {
            throw new Usage("not a number of seconds: " + s);
        }
    }

    static String decode(String s) {
        return URLDecoder.decode(s, StandardCharsets.UTF_8);
    }

    static class Usage extends RuntimeException {
        Usage(String message) {
            super(message);
        }
    }

    // ------------------------------------------------------------ message <-> JSON

    static class Spec {
        /** A received message as the JSON shape above. */
        static Map<String, Object> describe(Message<?> received) throws ClientException {
            AdvancedMessage<?> m = received.toAdvancedMessage();
            Map<String, Object> out = new LinkedHashMap<>();
            Header h = m.header();
            if (h == null) {
                out.put("header", null);
            } else {
                Map<String, Object> header = new LinkedHashMap<>();
                header.put("durable", h.hasDurable() ? h.isDurable() : null);
                header.put("priority", h.hasPriority() ? h.getPriority() & 0xff : null);
                header.put("ttl", h.hasTimeToLive() ? h.getTimeToLive() : null);
                header.put("first_acquirer", h.hasFirstAcquirer() ? h.isFirstAcquirer() : null);
                header.put("delivery_count", h.hasDeliveryCount() ? h.getDeliveryCount() : null);
                out.put("header", header);
            }
            Properties p = m.properties();
            if (p == null) {
                out.put("properties", null);
            } else {
                Map<String, Object> props = new LinkedHashMap<>();
                props.put("message_id", p.hasMessageId() ? typed(p.getMessageId()) : null);
                props.put("user_id", p.hasUserId() ? base64(p.getUserId().asByteArray()) : null);
                props.put("to", p.getTo());
                props.put("subject", p.getSubject());
                props.put("reply_to", p.getReplyTo());
                props.put("correlation_id", p.hasCorrelationId() ? typed(p.getCorrelationId()) : null);
                props.put("content_type", p.getContentType());
                props.put("content_encoding", p.getContentEncoding());
                props.put("absolute_expiry_time", p.hasAbsoluteExpiryTime() ? p.getAbsoluteExpiryTime() : null);
                props.put("creation_time", p.hasCreationTime() ? p.getCreationTime() : null);
                props.put("group_id", p.getGroupId());
                out.put("properties", props);
            }
            MessageAnnotations ma = m.annotations();
            if (ma == null || ma.getValue() == null) {
                out.put("message_annotations", null);
            } else {
                Map<String, Object> ann = new LinkedHashMap<>();
                ma.getValue().forEach((k, v) -> ann.put(String.valueOf(k), typed(v)));
                out.put("message_annotations", ann);
            }
            ApplicationProperties ap = m.applicationProperties();
            if (ap == null || ap.getValue() == null) {
                out.put("application_properties", null);
            } else {
                Map<String, Object> app = new LinkedHashMap<>();
                ap.getValue().forEach((k, v) -> app.put(k, typed(v)));
                out.put("application_properties", app);
            }
            List<Object> body = new ArrayList<>();
            for (Section<?> s : m.bodySections()) {
                Map<String, Object> section = new LinkedHashMap<>();
                if (s instanceof Data d) {
                    section.put("kind", "data");
                    section.put("base64", base64(d.getValue()));
                } else if (s instanceof AmqpValue<?> v) {
                    section.put("kind", "amqp-value");
                    section.put("value", typed(v.getValue()));
                } else if (s instanceof AmqpSequence<?> q) {
                    section.put("kind", "amqp-sequence");
                    section.put("value", typed(q.getValue()).get("value"));
                } else {
                    section.put("kind", String.valueOf(s.getType()));
                }
                body.add(section);
            }
            out.put("body", body);
            return out;
        }

        /** A message to send from the JSON shape above. */
        @SuppressWarnings("unchecked")
        static AdvancedMessage<Object> message(Object json) throws ClientException {
            Map<String, Object> spec = asMap(json, "the message");
            AdvancedMessage<Object> m = AdvancedMessage.create();
            List<String> known = List.of("header", "properties", "message_annotations", "application_properties", "body");
            for (String key : spec.keySet()) {
                if (!known.contains(key)) throw new Usage("unknown message section " + key);
            }
            if (spec.get("header") != null) {
                Map<String, Object> h = asMap(spec.get("header"), "header");
                Header header = new Header();
                for (var e : h.entrySet()) {
                    Object v = e.getValue();
                    if (v == null) continue;
                    switch (e.getKey()) {
                        case "durable" -> header.setDurable(asBool(v, "durable"));
                        case "priority" -> header.setPriority((byte) asLong(v, "priority"));
                        case "ttl" -> header.setTimeToLive(asLong(v, "ttl"));
                        case "first_acquirer" -> header.setFirstAcquirer(asBool(v, "first_acquirer"));
                        case "delivery_count" -> header.setDeliveryCount(asLong(v, "delivery_count"));
                        default -> throw new Usage("unknown header field " + e.getKey());
                    }
                }
                m.header(header);
            }
            if (spec.get("properties") != null) {
                Map<String, Object> p = asMap(spec.get("properties"), "properties");
                Properties props = new Properties();
                for (var e : p.entrySet()) {
                    Object v = e.getValue();
                    if (v == null) continue;
                    switch (e.getKey()) {
                        case "message_id" -> props.setMessageId(value(v));
                        case "user_id" -> props.setUserId(new Binary(unbase64(v, "user_id")));
                        case "to" -> props.setTo(asString(v, "to"));
                        case "subject" -> props.setSubject(asString(v, "subject"));
                        case "reply_to" -> props.setReplyTo(asString(v, "reply_to"));
                        case "correlation_id" -> props.setCorrelationId(value(v));
                        case "content_type" -> props.setContentType(asString(v, "content_type"));
                        case "content_encoding" -> props.setContentEncoding(asString(v, "content_encoding"));
                        case "absolute_expiry_time" -> props.setAbsoluteExpiryTime(asLong(v, "absolute_expiry_time"));
                        case "creation_time" -> props.setCreationTime(asLong(v, "creation_time"));
                        case "group_id" -> props.setGroupId(asString(v, "group_id"));
                        default -> throw new Usage("unknown property " + e.getKey());
                    }
                }
                m.properties(props);
            }
            if (spec.get("message_annotations") != null) {
                Map<Symbol, Object> ann = new LinkedHashMap<>();
                asMap(spec.get("message_annotations"), "message_annotations")
                        .forEach((k, v) -> ann.put(Symbol.valueOf(k), value(v)));
                m.annotations(new MessageAnnotations(ann));
            }
            if (spec.get("application_properties") != null) {
                Map<String, Object> app = new LinkedHashMap<>();
                asMap(spec.get("application_properties"), "application_properties")
                        .forEach((k, v) -> app.put(k, value(v)));
                m.applicationProperties(new ApplicationProperties(app));
            }
            Object body = spec.get("body");
            List<Object> sections = body == null ? List.of()
                    : body instanceof List<?> l ? (List<Object>) l : List.of(body);
            for (Object s : sections) {
                Map<String, Object> section = asMap(s, "a body section");
                Object kind = section.get("kind");
                if ("data".equals(kind)) {
                    m.addBodySection(new Data(unbase64(section.get("base64"), "data base64")));
                } else if ("amqp-value".equals(kind)) {
                    m.addBodySection(new AmqpValue<>(value(section.get("value"))));
                } else if ("amqp-sequence".equals(kind)) {
                    List<Object> items = new ArrayList<>();
                    for (Object item : asList(section.get("value"), "amqp-sequence value")) items.add(value(item));
                    m.addBodySection(new AmqpSequence<>(items));
                } else {
                    throw new Usage("unknown body section kind " + kind);
                }
            }
            return m;
        }

        /** {"type": T, "value": V} of a decoded AMQP value. */
        static Map<String, Object> typed(Object v) {
            String type;
            Object value = v;
            if (v == null) type = "null";
            else if (v instanceof Boolean) type = "boolean";
            else if (v instanceof UnsignedByte u) { type = "ubyte"; value = u.intValue(); }
            else if (v instanceof UnsignedShort u) { type = "ushort"; value = u.intValue(); }
            else if (v instanceof UnsignedInteger u) { type = "uint"; value = u.longValue(); }
            else if (v instanceof UnsignedLong u) { type = "ulong"; value = u.bigIntegerValue(); }
            else if (v instanceof Byte) type = "byte";
            else if (v instanceof Short) type = "short";
            else if (v instanceof Integer) type = "int";
            else if (v instanceof Long) type = "long";
            else if (v instanceof Float) type = "float";
            else if (v instanceof Double) type = "double";
            else if (v instanceof Character c) { type = "char"; value = String.valueOf(c); }
            else if (v instanceof String) type = "string";
            else if (v instanceof Symbol s) { type = "symbol"; value = s.toString(); }
            else if (v instanceof Date d) { type = "timestamp"; value = d.getTime(); }
            else if (v instanceof UUID u) { type = "uuid"; value = u.toString(); }
            else if (v instanceof Binary b) { type = "binary"; value = base64(b.asByteArray()); }
            else if (v instanceof byte[] b) { type = "binary"; value = base64(b); }
            else if (v instanceof List<?> l) {
                type = "list";
                List<Object> items = new ArrayList<>();
                for (Object item : l) items.add(typed(item));
                value = items;
            } else if (v instanceof Map<?, ?> mp) {
                type = "map";
                List<Object> pairs = new ArrayList<>();
                mp.forEach((k, x) -> pairs.add(List.of(typed(k), typed(x))));
                value = pairs;
            } else if (v.getClass().isArray()) {
                type = "array";
                List<Object> items = new ArrayList<>();
                for (int i = 0; i < java.lang.reflect.Array.getLength(v); i++) {
                    items.add(typed(java.lang.reflect.Array.get(v, i)));
                }
                value = items;
            } else {
                type = v.getClass().getSimpleName(); // decimal32/64/128 and whatever else: its text
                value = v.toString();
            }
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("type", type);
            out.put("value", value);
            return out;
        }

        /** The Java value protonj2 encodes as the AMQP type a {"type", "value"} names. */
        static Object value(Object json) {
            Map<String, Object> t = asMap(json, "a typed value {\"type\": .., \"value\": ..}");
            String type = asString(t.get("type"), "type");
            Object v = t.get("value");
            if (type.equals("null")) return null;
            if (v == null) throw new Usage("a " + type + " without a value");
            try {
                return switch (type) {
                    case "boolean" -> asBool(v, type);
                    case "ubyte" -> UnsignedByte.valueOf((byte) range(v, 0, 0xff));
                    case "ushort" -> UnsignedShort.valueOf((short) range(v, 0, 0xffff));
                    case "uint" -> UnsignedInteger.valueOf(range(v, 0, 0xffffffffL));
                    case "ulong" -> UnsignedLong.valueOf(asBig(v, type));
                    case "byte" -> (byte) range(v, Byte.MIN_VALUE, Byte.MAX_VALUE);
                    case "short" -> (short) range(v, Short.MIN_VALUE, Short.MAX_VALUE);
                    case "int" -> (int) range(v, Integer.MIN_VALUE, Integer.MAX_VALUE);
                    case "long" -> asLong(v, type);
                    case "float" -> asNumber(v, type).floatValue();
                    case "double" -> asNumber(v, type).doubleValue();
                    case "char" -> asString(v, type).charAt(0);
                    case "string" -> asString(v, type);
                    case "symbol" -> Symbol.valueOf(asString(v, type));
                    case "timestamp" -> new Date(asLong(v, type));
                    case "uuid" -> UUID.fromString(asString(v, type));
                    case "binary" -> new Binary(unbase64(v, type));
                    case "list" -> {
                        List<Object> items = new ArrayList<>();
                        for (Object item : asList(v, type)) items.add(value(item));
                        yield items;
                    }
                    case "map" -> {
                        Map<Object, Object> map = new LinkedHashMap<>();
                        for (Object pair : asList(v, type)) {
                            List<Object> kv = asList(pair, "a map entry [key, value]");
                            if (kv.size() != 2) throw new Usage("a map entry is not [key, value]");
                            map.put(value(kv.get(0)), value(kv.get(1)));
                        }
                        yield map;
                    }
                    default -> throw new Usage("unknown AMQP type " + type);
                };
            } catch (IllegalArgumentException e) { // a UUID, a base64 or a range protonj2 refused
                throw new Usage("bad " + type + " value " + Json.write(v) + ": " + e.getMessage());
            }
        }

        static long range(Object v, long lo, long hi) {
            long n = asLong(v, "a number");
            if (n < lo || n > hi) throw new Usage(n + " is outside " + lo + ".." + hi);
            return n;
        }

        @SuppressWarnings("unchecked")
        static Map<String, Object> asMap(Object v, String what) {
            if (v instanceof Map<?, ?> m) return (Map<String, Object>) m;
            throw new Usage(what + " is not a JSON object");
        }

        @SuppressWarnings("unchecked")
        static List<Object> asList(Object v, String what) {
            if (v instanceof List<?> l) return (List<Object>) l;
            throw new Usage(what + " is not a JSON array");
        }

        static String asString(Object v, String what) {
            if (v instanceof String s) return s;
            throw new Usage(what + " is not a string");
        }

        static boolean asBool(Object v, String what) {
            if (v instanceof Boolean b) return b;
            throw new Usage(what + " is not true or false");
        }

        static BigDecimal asNumber(Object v, String what) {
            if (v instanceof BigDecimal d) return d;
            throw new Usage(what + " is not a number");
        }

        static BigInteger asBig(Object v, String what) {
            try {
                return asNumber(v, what).toBigIntegerExact();
            } catch (ArithmeticException e) {
                throw new Usage(what + " is not a whole number");
            }
        }

        static long asLong(Object v, String what) {
            try {
                return asBig(v, what).longValueExact();
            } catch (ArithmeticException e) {
                throw new Usage(what + " does not fit a long");
            }
        }

        static byte[] unbase64(Object v, String what) {
            try {
                return Base64.getDecoder().decode(asString(v, what));
            } catch (IllegalArgumentException e) {
                throw new Usage(what + " is not base64");
            }
        }

        static String base64(byte[] b) {
            return Base64.getEncoder().encodeToString(b);
        }
    }

    // ------------------------------------------------------------ minimal JSON

    /** Writes null, Boolean, Number, String, Map and List; nothing else is needed here. */
    static class Json {
        static String write(Object v) {
            StringBuilder sb = new StringBuilder();
            write(v, sb);
            return sb.toString();
        }

        static void write(Object v, StringBuilder sb) {
            if (v == null) {
                sb.append("null");
            } else if (v instanceof Boolean || v instanceof Integer || v instanceof Long || v instanceof Short
                    || v instanceof Byte || v instanceof BigInteger || v instanceof BigDecimal) {
                sb.append(v);
            } else if (v instanceof Number n) { // float, double: JSON has no NaN or infinities
                double d = n.doubleValue();
                if (Double.isFinite(d)) sb.append(v); else string(v.toString(), sb);
            } else if (v instanceof Map<?, ?> m) {
                sb.append('{');
                boolean first = true;
                for (var e : m.entrySet()) {
                    if (!first) sb.append(',');
                    first = false;
                    string(String.valueOf(e.getKey()), sb);
                    sb.append(':');
                    write(e.getValue(), sb);
                }
                sb.append('}');
            } else if (v instanceof List<?> l) {
                sb.append('[');
                for (int i = 0; i < l.size(); i++) {
                    if (i > 0) sb.append(',');
                    write(l.get(i), sb);
                }
                sb.append(']');
            } else {
                string(v.toString(), sb);
            }
        }

        static void string(String s, StringBuilder sb) {
            sb.append('"');
            for (int i = 0; i < s.length(); i++) {
                char c = s.charAt(i);
                switch (c) {
                    case '"' -> sb.append("\\\"");
                    case '\\' -> sb.append("\\\\");
                    case '\n' -> sb.append("\\n");
                    case '\r' -> sb.append("\\r");
                    case '\t' -> sb.append("\\t");
                    default -> {
                        if (c < 0x20) sb.append(String.format("\\u%04x", (int) c)); else sb.append(c);
                    }
                }
            }
            sb.append('"');
        }
    }

    /** Reads one JSON document: objects as LinkedHashMap, arrays as List, numbers as BigDecimal. */
    static class JsonReader {
        final String s;
        int i;

        JsonReader(String s) {
            this.s = s;
        }

        Object document() {
            Object v = value();
            space();
            if (i != s.length()) throw error("text after the document");
            return v;
        }

        Object value() {
            space();
            if (i >= s.length()) throw error("unexpected end");
            char c = s.charAt(i);
            if (c == '{') {
                i++;
                Map<String, Object> m = new LinkedHashMap<>();
                space();
                if (peek('}')) return m;
                do {
                    space();
                    String key = string();
                    space();
                    expect(':');
                    m.put(key, value());
                    space();
                } while (peek(','));
                expect('}');
                return m;
            }
            if (c == '[') {
                i++;
                List<Object> l = new ArrayList<>();
                space();
                if (peek(']')) return l;
                do {
                    l.add(value());
                    space();
                } while (peek(','));
                expect(']');
                return l;
            }
            if (c == '"') return string();
            if (s.startsWith("true", i)) { i += 4; return Boolean.TRUE; }
            if (s.startsWith("false", i)) { i += 5; return Boolean.FALSE; }
            if (s.startsWith("null", i)) { i += 4; return null; }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            if (start == i) throw error("unexpected '" + c + "'");
            try {
                return new BigDecimal(s.substring(start, i));
            } catch (NumberFormatException e) {
                throw error("bad number");
            }
        }

        String string() {
            expect('"');
            StringBuilder sb = new StringBuilder();
            while (true) {
                if (i >= s.length()) throw error("unterminated string");
                char c = s.charAt(i++);
                if (c == '"') return sb.toString();
                if (c != '\\') {
                    sb.append(c);
                    continue;
                }
                if (i >= s.length()) throw error("unterminated escape");
                char e = s.charAt(i++);
                switch (e) {
                    case '"', '\\', '/' -> sb.append(e);
                    case 'b' -> sb.append('\b');
                    case 'f' -> sb.append('\f');
                    case 'n' -> sb.append('\n');
                    case 'r' -> sb.append('\r');
                    case 't' -> sb.append('\t');
                    case 'u' -> {
                        if (i + 4 > s.length()) throw error("short \\u escape");
                        sb.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        i += 4;
                    }
                    default -> throw error("bad escape \\" + e);
                }
            }
        }

        void space() {
            while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++;
        }

        boolean peek(char c) {
            if (i < s.length() && s.charAt(i) == c) {
                i++;
                return true;
            }
            return false;
        }

        void expect(char c) {
            if (!peek(c)) throw error("expected '" + c + "'");
        }

        IllegalArgumentException error(String what) {
            return new IllegalArgumentException(what + " at offset " + i);
        }
    }
}
