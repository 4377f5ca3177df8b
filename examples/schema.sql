-- The business tables the examples share: a booking (the business change) and the record of
-- emails sent (the consumer's "record what you did", which makes handling idempotent).
CREATE EXTENSION IF NOT EXISTS outbox_ext;

CREATE TABLE IF NOT EXISTS bookings (
    id          bigserial PRIMARY KEY,
    room        integer   NOT NULL,
    guest_email text      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS sent_emails (
    message_id  uuid PRIMARY KEY,          -- the outbox message's public_id: one email per message
    booking_id  bigint NOT NULL,
    guest_email text   NOT NULL,
    sent_by     text   NOT NULL,
    sent_at     timestamptz NOT NULL DEFAULT now()
);
