-- Of messages $1, those whose deliveries have all ended, locked, with how many of their
-- deliveries are DONE and what the dead ones say (endpoint: error, ...). An endpoint is named by
-- its subscription's id and its URL's origin, not the whole URL, whose path or query may carry
-- a token: the message's last_error reaches SQL consumers (a requeued message's claim), who may
-- not read the subscriptions (0.5.32 wrote the URL: stop 56's probe).
SELECT o.id,
       pg_catalog.count(*) FILTER (WHERE d.status OPERATOR(pg_catalog.=) 'DONE'::@extschema@.outbox_status),
       pg_catalog.count(*) FILTER (WHERE d.status OPERATOR(pg_catalog.=) 'DEAD'::@extschema@.outbox_status),
       pg_catalog.string_agg('subscription ' OPERATOR(pg_catalog.||) s.id OPERATOR(pg_catalog.||) ' ('
                             OPERATOR(pg_catalog.||) pg_catalog.substring(s.url, '^[^:/?#]+://[^/?#]*')
                             OPERATOR(pg_catalog.||) '): ' OPERATOR(pg_catalog.||) COALESCE(d.last_error, '?'), '; ' ORDER BY s.id)
           FILTER (WHERE d.status OPERATOR(pg_catalog.=) 'DEAD'::@extschema@.outbox_status)
  FROM ONLY @extschema@.outbox o
  JOIN ONLY @extschema@.outbox_delivery d ON d.message_id OPERATOR(pg_catalog.=) o.id
  JOIN @extschema@.outbox_subscription s ON s.id OPERATOR(pg_catalog.=) d.subscription_id
 WHERE o.id OPERATOR(pg_catalog.=) ANY ($1)
   -- (As text, so that the plan looks the messages up by id: see lock_messages.sql.)
   AND o.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PENDING'
 GROUP BY o.id
HAVING pg_catalog.count(*) FILTER (WHERE d.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status) OPERATOR(pg_catalog.=) 0
