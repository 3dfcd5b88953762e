"""SQL for other processes: the Spark Connect endpoint ``lakegate run`` and
``lakegate process`` serve (:mod:`.endpoint`), the client side ``lakegate
sql`` and the notebooks use (:mod:`.client`), ``mqtt_match`` as a SQL
function every session of the endpoint sees (:mod:`.match_sql`), the tables
as Delta tables in the catalog with the maintenance guard, with delta-spark
(:mod:`.catalog`), and as Python data sources over delta-rs without it
(:mod:`.delta_source`)."""
