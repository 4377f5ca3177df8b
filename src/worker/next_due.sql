-- When each endpoint $1 next has a delivery due (NULL: none claimable, now or later).
SELECT e.id,
       (SELECT d.available_at
          FROM ONLY @extschema@.outbox_delivery d
         WHERE d.subscription_id OPERATOR(pg_catalog.=) e.id
           AND d.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
           AND d.waiting_for IS NULL
         ORDER BY d.available_at
         LIMIT 1)
  FROM pg_catalog.unnest($1) AS e(id)
